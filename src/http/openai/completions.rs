//! `POST /{uuid}/v1/completions`: a text completion tracked on the session's nodes (the prompt
//! extends the node whose ids or text it starts with).

use super::envelope;
use super::request::{StopField, response_format};
use crate::chat::MAX_N;
use crate::generation::MAX_TOP_LOGPROBS;
use crate::generation::SamplingParams;
use crate::http::body::read_json;
use crate::http::{ApiError, AppState};
use crate::metrics::Stage;
use crate::session::replies::TurnKey;
use crate::tokenizer::Tokenizer;
use crate::turn::{ChoiceOutput, TextPrompt, TextRequest};
use actix_web::{HttpResponse, web};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Debug, Deserialize)]
pub struct CompletionBody {
    prompt: TextPrompt,
    max_tokens: Option<u32>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    seed: Option<i64>,
    n: Option<u32>,
    stop: Option<StopField>,
    /// Legacy OpenAI: number of alternatives per position.
    logprobs: Option<u32>,
    stream: Option<bool>,
    /// Add `prompt_token_ids` to each choice (as in vLLM).
    return_token_ids: Option<bool>,
    /// `json_schema` / `json_object`, enforced as for chat (as vLLM's completions take it).
    response_format: Option<Value>,
}

/// One `text_completion` choice.
#[derive(Serialize)]
struct TextChoice<'a> {
    index: usize,
    text: &'a str,
    finish_reason: &'static str,
    logprobs: Option<LegacyLogprobs>,
    token_ids: &'a [u32],
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<&'a [u32]>,
}

/// Legacy completions `logprobs`: each token's text and logprob, and its alternatives.
#[derive(Serialize)]
struct LegacyLogprobs {
    tokens: Vec<String>,
    /// Widened to f64, the form these replies have always had.
    token_logprobs: Vec<f64>,
    top_logprobs: Option<Vec<Map<String, Value>>>,
}

impl LegacyLogprobs {
    fn of(tokenizer: &Tokenizer, choice: &ChoiceOutput) -> Self {
        let generation = &choice.generation;
        let top_logprobs = generation.top_logprobs.as_ref().map(|positions| {
            positions
                .iter()
                .map(|alternatives| {
                    alternatives
                        .iter()
                        .map(|&(id, lp)| (tokenizer.decode(&[id]), Value::from(lp)))
                        .collect()
                })
                .collect()
        });
        Self {
            tokens: generation
                .token_ids
                .iter()
                .map(|&id| tokenizer.decode(&[id]))
                .collect(),
            token_logprobs: generation
                .logprobs
                .iter()
                .map(|&lp| f64::from(lp))
                .collect(),
            top_logprobs,
        }
    }
}

/// One text completion, recorded on the session.
pub async fn completions(
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
    key: Option<web::ReqData<TurnKey>>,
) -> Result<HttpResponse, ApiError> {
    let session = state.turn_session(&path.into_inner()).await?;
    let body: CompletionBody = {
        let _parse = state.pipeline.metrics.timed(Stage::Parse);
        read_json(payload, state.max_body_bytes).await?
    };
    if body.stream == Some(true) {
        return Err(ApiError::bad_request(
            "stream=true is not supported on /v1/completions; use the chat endpoint to stream",
        ));
    }
    let n = body.n.unwrap_or(1);
    if n == 0 || n > MAX_N {
        return Err(ApiError::bad_request(format!(
            "'n' must be between 1 and {MAX_N}"
        )));
    }
    if body.logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
        return Err(ApiError::bad_request(format!(
            "'logprobs' must be at most {MAX_TOP_LOGPROBS}"
        )));
    }
    let params = SamplingParams {
        max_tokens: body.max_tokens.or(state.default_max_tokens),
        temperature: body.temperature,
        top_p: body.top_p,
        top_k: body.top_k,
        min_p: body.min_p,
        seed: body.seed,
        stop: StopField::list(body.stop),
        top_logprobs: body.logprobs,
        constraint: crate::grammar::for_response_format(
            &response_format(body.response_format.as_ref())
                .map_err(|e| ApiError::bad_request(e.to_string()))?,
        )
        .map_err(|e| ApiError::bad_request(e.to_string()))?,
    };
    params.check().map_err(ApiError::bad_request)?;
    let return_token_ids = body.return_token_ids.unwrap_or(false);
    let top_logprobs = body.logprobs;
    let request = TextRequest {
        prompt: body.prompt,
        params,
        n,
        key: key.map(|key| key.into_inner()),
    };
    let output = state.pipeline.complete_text(&session, &request).await?;
    let tokenizer = &state.pipeline.context.tokenizer;
    let choices: Vec<TextChoice> = output
        .choices
        .iter()
        .enumerate()
        .map(|(index, choice)| TextChoice {
            index,
            text: &choice.reply.text,
            finish_reason: choice.generation.finish_reason.as_str(),
            logprobs: top_logprobs.map(|_| LegacyLogprobs::of(tokenizer, choice)),
            token_ids: &choice.generation.token_ids,
            prompt_token_ids: return_token_ids.then(|| output.prompt_ids()),
        })
        .collect();
    Ok(HttpResponse::Ok().json(envelope(
        "text_completion",
        "cmpl",
        &state.model_name,
        choices,
        &output.usage(),
    )))
}
