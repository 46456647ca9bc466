//! A streamed turn: the [`super::driver`] runs in a task and hands each step to the client
//! as a [`TurnEvent`]; the node is committed when every choice has finished. A client that
//! disconnects drops the receiver, which ends the task, which drops the backend streams
//! (cancelling the requests) and leaves the session as it was.

use super::driver::{Driver, Ended, Events};
use super::events::{TurnEvent, TurnStream};
use super::{Pipeline, TurnError, TurnRequest};
use crate::chat::ChatRequest;
use crate::metrics::Stage;
use crate::session::Api;
use crate::session::Session;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

/// What a streamed turn tells its caller once its samples are open (or failed to open).
struct Head {
    prompt_ids: Arc<Vec<u32>>,
}

impl Pipeline {
    /// Starts a streamed turn on `session`. Errors before the samples open (a bad template,
    /// no backend) are returned; later ones arrive as [`TurnEvent::Failed`].
    pub async fn stream(
        &self,
        session: Arc<Session>,
        request: ChatRequest,
    ) -> Result<TurnStream, TurnError> {
        let api = request.api;
        let choices = request.n as usize;
        let (sender, events) = mpsc::channel(64);
        let (head_sender, head) = oneshot::channel();
        let span = self.turn_span(&session, api);
        let task = self
            .clone()
            .streamed_turn(session, request, sender, head_sender);
        tokio::spawn(task.instrument(span.clone()));
        let head = async {
            let head = head.await.unwrap_or(Err(TurnError::SessionClosed));
            if let Err(error) = &head {
                self.failed(api, error);
            }
            head
        };
        let head = head.instrument(span).await?;
        Ok(TurnStream {
            choices,
            prompt_ids: head.prompt_ids,
            events,
        })
    }

    /// The task of a streamed turn: the driver's steps sent as they happen, then the record.
    async fn streamed_turn(
        self,
        session: Arc<Session>,
        request: ChatRequest,
        sender: mpsc::Sender<TurnEvent>,
        head: oneshot::Sender<Result<Head, TurnError>>,
    ) {
        let _under_way = self.under_way();
        if let Err(error) =
            super::images::fetch_links(&self.context, &self.fetcher, &session, &request).await
        {
            return drop(head.send(Err(error)));
        }
        let mut guard = match super::pipeline::lock_open(&session, self.log.as_ref()).await {
            Ok(guard) => guard,
            Err(error) => return drop(head.send(Err(error))),
        };
        let turn = TurnRequest::Chat(&request);
        let mut driver = Driver::new(&self, &session, turn, Events::Sent(sender));
        let planned = match driver.open(&guard).await {
            Ok(planned) => planned,
            Err(error) => return drop(head.send(Err(error))),
        };
        let opened = Head {
            prompt_ids: planned.plan.prompt_ids.clone(),
        };
        if head.send(Ok(opened)).is_err() {
            return;
        }
        let replayed = planned.replayed;
        let output = match driver.relay(planned).await {
            Ok(output) => output,
            Err(Ended::Gone) => return,
            Err(Ended::Failed(error)) => {
                return self.fail_stream(&driver, request.api, error).await;
            }
        };
        if !replayed && let Err(error) = driver.record(&mut guard, &output, None).await {
            return self.fail_stream(&driver, request.api, error).await;
        }
        self.metrics.time(Stage::Turn, driver.started().elapsed());
        let _ = driver.send(TurnEvent::Done(output.usage())).await;
    }

    /// Counts a streamed turn's failure and tells the client.
    async fn fail_stream(&self, driver: &Driver<'_>, api: Api, error: TurnError) {
        self.failed(api, &error);
        let _ = driver.send(TurnEvent::Failed(error)).await;
    }
}
