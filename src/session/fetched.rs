//! The images fetched for a session's conversation, by URL: within a session a URL stands for
//! the bytes first fetched from it. A conversation resent turn after turn is then fetched
//! once, and an image of its history cannot change under the node that holds it (a host
//! that serves other bytes later changes nothing the session recorded).

use crate::chat::Image;
use std::collections::VecDeque;
use std::sync::Arc;

/// Most bytes of fetched images one session keeps (the oldest go first; one gone is fetched
/// again when it is named again), and most one request may fetch. The same order as the
/// request body a session keeps to read the next one only where it is new (`--max-body-mib`'s
/// default).
pub const FETCHED_BYTES: usize = 64 * 1024 * 1024;

/// Fetched images by URL, oldest first, within [`FETCHED_BYTES`].
#[derive(Debug, Default)]
pub struct FetchedImages {
    images: VecDeque<(String, Arc<Image>)>,
    bytes: usize,
}

impl FetchedImages {
    /// The image fetched from `url`, if kept.
    pub fn get(&self, url: &str) -> Option<Arc<Image>> {
        let found = self.images.iter().find(|(kept, _)| kept == url);
        found.map(|(_, image)| image.clone())
    }

    /// Keeps the image fetched from `url` (one over the limit alone is not kept).
    pub fn keep(&mut self, url: &str, image: Arc<Image>) {
        let size = image.bytes.len() + url.len();
        if size > FETCHED_BYTES || self.get(url).is_some() {
            return;
        }
        while self.bytes + size > FETCHED_BYTES {
            let Some((url, oldest)) = self.images.pop_front() else {
                break;
            };
            self.bytes -= oldest.bytes.len() + url.len();
        }
        self.bytes += size;
        self.images.push_back((url.to_string(), image));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::Part;

    fn image() -> Arc<Image> {
        let url = crate::chat::images::tests::png_data_url(4, 4);
        match Part::image_url(&url).unwrap() {
            Part::Image(image) => image,
            _ => unreachable!("a data: URL"),
        }
    }

    #[test]
    fn the_oldest_go_first_past_the_limit() {
        let image = image();
        let mut fetched = FetchedImages::default();
        for i in 0..30 {
            fetched.keep(&format!("https://h/{}", i % 10), image.clone());
        }
        // Ten URLs, each kept once.
        assert_eq!(fetched.images.len(), 10);
        assert!(fetched.get("https://h/3").is_some());
        assert!(fetched.get("https://h/10").is_none());
        fetched.bytes = FETCHED_BYTES - 1;
        fetched.keep("https://h/new", image.clone());
        assert!(fetched.get("https://h/new").is_some());
        assert!(fetched.get("https://h/0").is_none(), "the oldest went");
        assert!(fetched.bytes <= FETCHED_BYTES);
    }
}
