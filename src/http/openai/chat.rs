//! `POST /{uuid}/v1/chat/completions` and its `/render` twin: the OpenAI chat wire format
//! in and out, around one turn of the pipeline.

use super::request::{ChatCall, ReplyOptions, read_chat};
use super::{ChatLogprobs, ToolCallOut, chat_logprobs, envelope};
use crate::generation::StopMatch;
use crate::http::body::{json_response, json_with_ids, read_body};
use crate::http::{ApiError, AppState};
use crate::metrics::Stage;
use crate::session::Session;
use crate::session::replies::TurnKey;
use crate::turn::{Reply, TurnOutput};
use actix_web::{HttpResponse, web};
use serde::Serialize;
use std::sync::Arc;

async fn parse(
    state: &AppState,
    session: Arc<Session>,
    payload: web::Payload,
) -> Result<(Arc<Session>, ChatCall), ApiError> {
    let _parse = state.pipeline.metrics.timed(Stage::Parse);
    let body = read_body(payload, state.max_body_bytes).await?;
    let call = read_chat(&session, &body, state.default_max_tokens)?;
    Ok((session, call))
}

/// Shows the exact prompt a real call would send now; changes nothing.
pub async fn render(
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    // Read as it is now (a turn brings the session up to date once it holds it).
    let session = state.session(&path.into_inner()).await?;
    let (session, call) = parse(&state, session, payload).await?;
    let rendered = state.pipeline.render(&session, &call.turn).await?;
    Ok(crate::http::render_reply(rendered))
}

/// One chat turn: the reply whole, or as server-sent events with `stream`.
pub async fn completions(
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
    key: Option<web::ReqData<TurnKey>>,
) -> Result<HttpResponse, ApiError> {
    let session = state.turn_session(&path.into_inner()).await?;
    let (session, ChatCall { mut turn, reply }) = parse(&state, session, payload).await?;
    turn.key = key.map(web::ReqData::into_inner);
    if reply.stream {
        let stream = state.pipeline.stream(session, turn).await?;
        return Ok(super::chat_stream::respond(&state, reply, stream));
    }
    let output = state.pipeline.run(&session, &turn).await?;
    Ok(json_response(body(&state, reply, &output)))
}

/// The reply: the prompt's ids are written straight from the turn (a long history costs no
/// JSON value per token).
fn body(state: &AppState, options: ReplyOptions, output: &TurnOutput) -> Vec<u8> {
    let tokenizer = &state.pipeline.context.tokenizer;
    let choices: Vec<_> = output
        .choices
        .iter()
        .enumerate()
        .map(|(index, choice)| ChatChoice {
            index,
            message: chat_message(&choice.reply),
            finish_reason: choice.reply.finish.as_openai(),
            logprobs: options
                .logprobs
                .then(|| chat_logprobs(tokenizer, &choice.generation)),
            token_ids: &choice.generation.token_ids,
            stop_reason: choice.generation.stop.as_ref(),
        })
        .collect();
    let body = envelope(
        "chat.completion",
        "chatcmpl",
        &state.model_name,
        choices,
        &output.usage(),
    );
    match options.return_token_ids {
        true => json_with_ids(&body, "prompt_token_ids", output.prompt_ids()),
        false => serde_json::to_vec(&body).unwrap_or_default(),
    }
}

/// One choice of a chat reply.
#[derive(Debug, Serialize)]
pub struct ChatChoice<'a> {
    pub index: usize,
    pub message: ChatReplyMessage<'a>,
    pub finish_reason: &'static str,
    pub logprobs: Option<ChatLogprobs<'a>>,
    pub token_ids: &'a [u32],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<&'a StopMatch>,
}

/// The `message` object of a chat choice.
#[derive(Debug, Serialize)]
pub struct ChatReplyMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tool_calls: Vec<ToolCallOut<'a>>,
}

/// The `message` of the choice shown for `reply`.
pub fn chat_message(reply: &Reply) -> ChatReplyMessage<'_> {
    ChatReplyMessage {
        role: "assistant",
        content: reply.content.as_deref(),
        reasoning_content: reply.reasoning.as_deref(),
        tool_calls: reply.tool_calls.iter().map(ToolCallOut::of).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::{FinishReason, Generation, StopMatch};
    use crate::tokenizer::Tokenizer;
    use crate::turn::{Finish, ReturnedCall};
    use serde_json::json;

    #[test]
    fn a_chat_choice_is_written_in_openai_field_order() {
        let tokenizer = Tokenizer::from_tokenizer(crate::tokenizer::fixture_tokenizer("qwen3"));
        let (hi, there) = (
            tokenizer.encode("Hi").unwrap()[0],
            tokenizer.encode(" there").unwrap()[0],
        );
        let mut generation = Generation::new(vec![hi], vec![-0.1], FinishReason::Stop);
        generation.top_logprobs = Some(vec![vec![(hi, -0.1), (there, -2.5)]]);
        generation.stop = Some(StopMatch::Token(7));
        let reply = Reply {
            content: None,
            reasoning: Some("hmm".into()),
            tool_calls: vec![ReturnedCall {
                id: "call_0".into(),
                name: "f".into(),
                arguments: "{\"a\":1}".into(),
                offset: 0,
                healed_from: None,
            }],
            finish: Finish::ToolCalls,
            text: String::new(),
            end_token_text: None,
            tool_outcomes: Default::default(),
        };
        let choice = ChatChoice {
            index: 0,
            message: chat_message(&reply),
            finish_reason: reply.finish.as_openai(),
            logprobs: Some(chat_logprobs(&tokenizer, &generation)),
            token_ids: &generation.token_ids,
            stop_reason: generation.stop.as_ref(),
        };
        // The logprob is the f32 widened to f64, as replies have always shown it.
        let expected = format!(
            r#"{{"index":0,"message":{{"role":"assistant","content":null,"reasoning_content":"hmm","tool_calls":[{{"id":"call_0","type":"function","function":{{"name":"f","arguments":"{{\"a\":1}}"}}}}]}},"finish_reason":"tool_calls","logprobs":{{"content":[{{"token":"Hi","logprob":-0.10000000149011612,"bytes":[72,105],"top_logprobs":[{{"token":"Hi","logprob":-0.10000000149011612,"bytes":[72,105]}},{{"token":" there","logprob":-2.5,"bytes":[32,116,104,101,114,101]}}]}}]}},"token_ids":[{hi}],"stop_reason":7}}"#
        );
        assert_eq!(serde_json::to_string(&choice).unwrap(), expected);

        let plain = Reply {
            content: Some("ok".into()),
            reasoning: None,
            tool_calls: Vec::new(),
            ..reply
        };
        assert_eq!(
            serde_json::to_value(chat_message(&plain)).unwrap(),
            json!({"role": "assistant", "content": "ok"})
        );
        let no_top = Generation::new(vec![hi], vec![-0.5], FinishReason::Length);
        assert_eq!(
            serde_json::to_value(chat_logprobs(&tokenizer, &no_top)).unwrap(),
            json!({"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []}]})
        );
    }
}
