//! A prompt's images: each image's single `<|image_pad|>` as the template and tokenizer wrote
//! it becomes the run of placeholders the model's processor makes of that image
//! ([`crate::vision`]), so the node holds the ids the model sees; each run is recorded with
//! the image's hash and patch grid.
//!
//! A node extended by the turn already holds its images' runs: they must be the
//! conversation's first images, and the new part of the prompt must hold one placeholder for
//! each image after them. Anything else (a placeholder the client typed, one the model
//! sampled, an image the template left out) is refused: a run that does not stand for its
//! image would train the model on the wrong pixels.

use super::{Plan, TurnContext, TurnError};
use crate::chat::{ChatRequest, Image, ImageLink, MAX_IMAGES};
use crate::fetch::Fetcher;
use crate::generation::{ImageSpan, PromptImage};
use crate::session::{FETCHED_BYTES, Session, SessionState};
use futures::{StreamExt, TryStreamExt};
use std::collections::HashMap;
use std::sync::Arc;

/// URLs fetched at once for one request.
const FETCHES_AT_ONCE: usize = 4;

/// The longest stretch of a URL an error quotes.
const URL_QUOTED: usize = 120;

/// Gives each image the conversation names by URL its bytes: those the session fetched from
/// that URL before ([`crate::session::FetchedImages`]), else fetched now, each URL once, a few
/// at a time. Called before the turn holds its session, so a slow image host holds up this
/// request only; nothing is fetched for a model that takes no images.
pub(super) async fn fetch_links(
    ctx: &TurnContext,
    fetcher: &Fetcher,
    session: &Session,
    request: &ChatRequest,
) -> Result<(), TurnError> {
    let links = request.messages.iter().flat_map(|m| m.links());
    let mut pending: Vec<&Arc<ImageLink>> = links.filter(|l| l.image().is_none()).collect();
    if pending.is_empty() {
        return Ok(());
    }
    takes_images(ctx)?;
    if let Ok(fetched) = session.fetched.lock() {
        pending.retain(|link| match fetched.get(&link.url) {
            Some(image) => {
                link.keep(image);
                false
            }
            None => true,
        });
    }
    if pending.is_empty() {
        return Ok(());
    }
    // Counted before anything is fetched: the fetched ones count among `images`.
    let images = request.messages.iter().flat_map(|m| m.images()).count();
    too_many(images + pending.len())?;
    let mut urls: Vec<&str> = pending.iter().map(|link| link.url.as_str()).collect();
    urls.sort_unstable();
    urls.dedup();
    // The futures are made before they are polled: a closure held across the awaits would
    // make the streamed turn's task too general for `tokio::spawn`.
    let fetches: Vec<_> = urls
        .into_iter()
        .map(|url| fetch_one(fetcher, url))
        .collect();
    let fetched = futures::stream::iter(fetches)
        .buffer_unordered(FETCHES_AT_ONCE)
        .try_fold((HashMap::new(), 0), |(mut fetched, total), (url, image)| {
            let total = total + image.bytes.len();
            fetched.insert(url, image);
            async move {
                match total > FETCHED_BYTES {
                    true => Err(TurnError::Images(format!(
                        "the images this request names by URL are over {} MiB together (a \
                         request body's images are bounded too); send fewer per request",
                        FETCHED_BYTES >> 20
                    ))),
                    false => Ok((fetched, total)),
                }
            }
        })
        .await?
        .0;
    for link in pending {
        if let Some(image) = fetched.get(link.url.as_str()) {
            link.keep(image.clone());
        }
    }
    if let Ok(mut kept) = session.fetched.lock() {
        fetched
            .into_iter()
            .for_each(|(url, image)| kept.keep(url, image));
    }
    Ok(())
}

/// The image at `url`, read.
async fn fetch_one<'u>(
    fetcher: &Fetcher,
    url: &'u str,
) -> Result<(&'u str, Arc<Image>), TurnError> {
    let bytes = fetcher.fetch(url).await.map_err(|error| TurnError::Fetch {
        url: quote(url),
        error,
    })?;
    let image = Image::read(bytes)
        .map_err(|reason| TurnError::Images(format!("the image at {}: {reason}", quote(url))))?;
    Ok((url, image))
}

/// `url`, or its start when it is long.
fn quote(url: &str) -> String {
    match url.char_indices().nth(URL_QUOTED) {
        Some((end, _)) => format!("{}...", &url[..end]),
        None => url.to_string(),
    }
}

/// The conversation's images, in order; refused when one named by URL was not fetched.
pub(super) fn of_request(request: &ChatRequest) -> Result<Vec<&Arc<Image>>, TurnError> {
    let unfetched = request
        .messages
        .iter()
        .flat_map(|m| m.links())
        .find(|l| l.image().is_none());
    if let Some(link) = unfetched {
        return Err(TurnError::Images(format!(
            "the image at {} was not fetched",
            quote(&link.url)
        )));
    }
    Ok(request.messages.iter().flat_map(|m| m.images()).collect())
}

fn too_many(images: usize) -> Result<(), TurnError> {
    if images > MAX_IMAGES {
        return Err(TurnError::Images(format!(
            "the conversation holds {images} images; at most {MAX_IMAGES} are taken"
        )));
    }
    Ok(())
}

/// Refuses images the model does not take, before anything is rendered.
pub(super) fn taken(ctx: &TurnContext, images: &[&Arc<Image>]) -> Result<(), TurnError> {
    if images.is_empty() {
        return Ok(());
    }
    takes_images(ctx)?;
    too_many(images.len())
}

/// Refuses images for a model that takes none.
fn takes_images(ctx: &TurnContext) -> Result<(), TurnError> {
    match ctx.vision {
        Some(_) => Ok(()),
        None => Err(TurnError::Images(
            "this model takes no images (its folder has no preprocessor_config.json, or its \
             vocabulary no <|image_pad|>)"
                .into(),
        )),
    }
}

/// `plan` with its images placed: every new placeholder expanded to its image's run, the runs
/// recorded on the plan. `images` are the conversation's, in order, already [`taken`].
pub(super) fn place(
    ctx: &TurnContext,
    state: &SessionState,
    images: &[&Arc<Image>],
    mut plan: Plan,
) -> Result<Plan, TurnError> {
    let refuse = |reason: String| Err(TurnError::Images(reason));
    let Some(vision) = &ctx.vision else {
        return Ok(plan);
    };
    let pad = vision.image_pad;
    let base: &[ImageSpan] = match plan.base {
        super::Base::Extend { node } => state.nodes[node].images(),
        super::Base::New { .. } => &[],
    };
    let same = base.len() <= images.len()
        && base
            .iter()
            .zip(images)
            .all(|(span, image)| *span.sha256 == image.facts.sha256);
    if !same {
        return refuse(
            "the node this turn extends holds images the request does not send (an image of \
             an earlier message was changed or left out); start a new session for another \
             conversation"
                .into(),
        );
    }
    let new_ids = &plan.prompt_ids[plan.base_len..];
    let placeholders = new_ids.iter().filter(|&&id| id == pad).count();
    let new_images = &images[base.len()..];
    if placeholders != new_images.len() {
        return refuse(format!(
            "the prompt holds {placeholders} new <|image_pad|> placeholders for {} new \
             images: each image must be rendered once by the template, and the text must \
             not hold the placeholder itself",
            new_images.len()
        ));
    }
    let mut placed: Vec<PromptImage> = base
        .iter()
        .zip(images)
        .map(|(span, image)| PromptImage {
            span: span.clone(),
            bytes: image.bytes.clone(),
        })
        .collect();
    let mut grids = Vec::with_capacity(new_images.len());
    for image in new_images {
        let grid = (vision.grid)
            .grid(image.facts.width, image.facts.height)
            .map_err(|e| TurnError::Images(e.to_string()))?;
        grids.push(grid);
    }
    if !new_images.is_empty() {
        let mut ids = Vec::with_capacity(plan.prompt_ids.len() + 1024);
        ids.extend_from_slice(&plan.prompt_ids[..plan.base_len]);
        let mut next = new_images.iter().zip(&grids);
        for &id in new_ids {
            if id != pad {
                ids.push(id);
                continue;
            }
            let (image, grid) = next
                .next()
                .expect("one image per placeholder, counted above");
            let length = grid.tokens(vision.grid.merge_size);
            placed.push(PromptImage {
                span: ImageSpan {
                    sha256: image.facts.sha256.as_str().into(),
                    media_type: image.facts.media_type.into(),
                    offset: ids.len(),
                    length,
                    grid_thw: grid.0,
                },
                bytes: image.bytes.clone(),
            });
            ids.resize(ids.len() + length, pad);
        }
        plan.prompt_ids = Arc::new(ids);
    }
    let runs: usize = placed.iter().map(|image| image.span.length).sum();
    if plan.prompt_ids.iter().filter(|&&id| id == pad).count() != runs {
        return refuse(
            "the prompt holds an <|image_pad|> outside the runs of its images (one the model \
             sampled in an earlier turn)"
                .into(),
        );
    }
    plan.images = placed.into();
    Ok(plan)
}
