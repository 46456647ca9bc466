//! The viewer's page, script and style sheet, compiled into the binary: the viewer works
//! offline and behind a firewall, and never loads anything from another host.

/// A file the viewer is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asset {
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static str,
}

/// The page (`GET /ui`).
pub const PAGE: Asset = Asset {
    content_type: "text/html; charset=utf-8",
    body: include_str!("assets/index.html"),
};

/// The asset served at `/ui/{name}`, if there is one.
pub fn named(name: &str) -> Option<Asset> {
    match name {
        "viewer.js" => Some(Asset {
            content_type: "text/javascript; charset=utf-8",
            body: include_str!("assets/viewer.js"),
        }),
        "viewer.css" => Some(Asset {
            content_type: "text/css; charset=utf-8",
            body: include_str!("assets/viewer.css"),
        }),
        _ => None,
    }
}
