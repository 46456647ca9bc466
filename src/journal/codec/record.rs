//! A committed turn ([`CommitRecord`]) in the journal's binary form, both ways. Fields added
//! after the first version (the key, healed calls, echo keys and echoed calls, weight spans,
//! routed experts, the conversation digest) are written last, in that order, so that a record
//! written before each still reads.

use super::{Corrupt, Reader, Writer, intern};
use crate::generation::{FinishReason, ImageSpan, RoutedExperts, StopMatch, WeightSpan};
use crate::session::replies::TurnKey;
use crate::session::{Api, ConversationDigest, EchoChange, EchoKey, Start, TurnLabels};
use crate::session::{CommitRecord, Divergence, HistoryEntry, IssuedToolCall, RecordedChoice};
use crate::tools::ToolFormat;
use std::sync::Arc;

/// The conversation count written when a record has no conversation digest but a section
/// after it follows.
const NO_CONVERSATION: u32 = u32::MAX;

impl Writer<'_> {
    /// A committed turn.
    pub(super) fn record(&mut self, record: &CommitRecord) {
        match &record.start {
            Start::Extend { node } => {
                self.u8(0);
                self.u32(*node as u32);
            }
            Start::New { divergence } => {
                self.u8(1);
                self.bool(divergence.is_some());
                if let Some(d) = divergence {
                    self.str(d.reason);
                    self.str(&d.detail);
                    self.opt_u32(d.from_node.map(|n| n as u32));
                    self.opt_u32(d.token_position.map(|n| n as u32));
                }
            }
        }
        self.ids(&record.new_prompt);
        self.u32(record.history.len() as u32);
        for entry in &record.history {
            self.u32(entry.completion as u32);
            self.check(&entry.before);
        }
        self.check(&record.next_check);
        self.str(record.labels.api.as_str());
        self.u32(record.labels.tools_left_out.len() as u32);
        record
            .labels
            .tools_left_out
            .iter()
            .for_each(|t| self.str(t));
        self.opt_str(record.labels.nudge);
        self.bool(record.track_tree);
        self.u32(record.choices.len() as u32);
        for choice in &record.choices {
            self.ids(&choice.token_ids);
            choice
                .logprobs
                .iter()
                .for_each(|lp| self.0.extend_from_slice(&lp.to_le_bytes()));
            self.u8(match choice.finish_reason {
                FinishReason::Stop => 0,
                FinishReason::Length => 1,
                FinishReason::Abort => 2,
            });
            match &choice.stop {
                None => self.u8(0),
                Some(StopMatch::Token(id)) => {
                    self.u8(1);
                    self.u32(*id);
                }
                Some(StopMatch::Text(text)) => {
                    self.u8(2);
                    self.str(text);
                }
            }
            self.opt_str(choice.weight_version.as_deref());
            self.opt_u32(choice.cached_tokens);
            self.bool(choice.approximate);
            self.opt_str(choice.end_token_text.as_deref());
            self.u32(choice.tool_calls.len() as u32);
            for call in &choice.tool_calls {
                self.str(&call.id);
                self.u64(call.call_hash);
            }
            self.u32(choice.fingerprints.len() as u32);
            choice.fingerprints.iter().for_each(|&f| self.u64(f));
            self.str(&choice.backend);
        }
        // Last, so a record written before keys were journaled reads as unkeyed; an empty key
        // stands for none when the sections after it follow.
        let healed: Vec<(usize, usize, &str)> = record
            .choices
            .iter()
            .enumerate()
            .flat_map(|(c, choice)| {
                let calls = choice.tool_calls.iter().enumerate();
                calls.filter_map(move |(i, call)| Some((c, i, call.healed_from?)))
            })
            .collect();
        let echo_keys: Vec<(usize, usize, &EchoKey)> = record
            .choices
            .iter()
            .enumerate()
            .flat_map(|(c, choice)| {
                let calls = choice.tool_calls.iter().enumerate();
                calls.filter_map(move |(i, call)| Some((c, i, call.echo.as_ref()?)))
            })
            .collect();
        // Each section is written when it or any section after it has something to say.
        let with_images = !record.images.is_empty();
        let with_conversation = with_images || record.conversation.is_some();
        let with_experts =
            with_conversation || record.choices.iter().any(|c| c.routed_experts.is_some());
        let with_spans = with_experts || record.choices.iter().any(|c| !c.weight_spans.is_empty());
        let with_echoes =
            with_spans || !echo_keys.is_empty() || !record.labels.echoed_calls.is_empty();
        if record.key.is_some() || !healed.is_empty() || with_echoes {
            let key = record.key.as_ref();
            self.str(key.map_or("", |k| k.key.as_str()));
            self.u64(key.map_or(0, |k| k.body_hash));
        }
        // After the key, so records written before calls were healed across formats read.
        if !healed.is_empty() || with_echoes {
            self.u32(healed.len() as u32);
            for (choice, call, format) in healed {
                self.u32(choice as u32);
                self.u32(call as u32);
                self.str(format);
            }
        }
        // After the healed calls, so records written before calls were recognised changed read.
        if with_echoes {
            self.u32(echo_keys.len() as u32);
            for (choice, call, echo) in echo_keys {
                self.u32(choice as u32);
                self.u32(call as u32);
                self.u64(echo.canonical_hash);
                self.u64(echo.text_hash);
                self.strings(&echo.default_keys);
            }
            self.u32(record.labels.echoed_calls.len() as u32);
            for echoed in &record.labels.echoed_calls {
                self.str(&echoed.id);
                self.str(echoed.change);
                self.strings(&echoed.keys);
            }
        }
        // After the echoes, so records written before samples spanned weight updates read.
        if with_spans {
            for choice in &record.choices {
                self.u32(choice.weight_spans.len() as u32);
                for span in &choice.weight_spans {
                    self.str(&span.version);
                    self.u32(span.start);
                    self.u32(span.end);
                }
            }
        }
        // After the spans, so records written before experts were recorded read.
        if with_experts {
            for choice in &record.choices {
                self.bool(choice.routed_experts.is_some());
                if let Some(experts) = &choice.routed_experts {
                    self.u32(experts.from);
                    self.u32(experts.width);
                    self.opt_u32(experts.layers);
                    self.u32(experts.ids.len() as u32);
                    experts
                        .ids
                        .iter()
                        .for_each(|id| self.0.extend_from_slice(&id.to_le_bytes()));
                }
            }
        }
        // After the experts, so records written before the digest was journaled read; a
        // count of u32::MAX stands for none when images follow.
        if with_conversation {
            let conversation = record.conversation.unwrap_or(ConversationDigest {
                messages: NO_CONVERSATION as usize,
                digest: 0,
            });
            self.u32(conversation.messages as u32);
            self.u64(conversation.digest);
        }
        // After the digest, so records written before images were taken read.
        if with_images {
            self.u32(record.images.len() as u32);
            for image in &record.images {
                self.str(&image.sha256);
                self.str(&image.media_type);
                self.u32(image.offset as u32);
                self.u32(image.length as u32);
                image.grid_thw.iter().for_each(|&n| self.u32(n));
            }
        }
    }
}

impl Reader<'_> {
    /// A committed turn.
    pub(super) fn record(&mut self) -> Result<CommitRecord, Corrupt> {
        let start = match self.u8()? {
            0 => Start::Extend {
                node: self.u32()? as usize,
            },
            1 => Start::New {
                divergence: match self.bool()? {
                    false => None,
                    true => Some(Divergence {
                        reason: intern(&self.string()?),
                        detail: self.string()?,
                        from_node: self.opt_u32()?.map(|n| n as usize),
                        token_position: self.opt_u32()?.map(|n| n as usize),
                    }),
                },
            },
            _ => return Err(Corrupt("base")),
        };
        let new_prompt = self.ids()?;
        let history = (0..self.len(13)?)
            .map(|_| {
                Ok(HistoryEntry {
                    completion: self.u32()? as usize,
                    before: self.check()?,
                })
            })
            .collect::<Result<_, Corrupt>>()?;
        let next_check = self.check()?;
        let api = Api::named(&self.string()?).ok_or(Corrupt("api"))?;
        let tools_left_out = (0..self.len(4)?)
            .map(|_| self.string())
            .collect::<Result<_, _>>()?;
        let nudge = self.opt_string()?.map(|n| intern(&n));
        let track_tree = self.bool()?;
        let mut choices: Vec<RecordedChoice> = (0..self.len(4)?)
            .map(|_| self.choice())
            .collect::<Result<_, _>>()?;
        let key = match self.bytes.is_empty() {
            true => None,
            false => {
                let key = self.string()?;
                let body_hash = self.u64()?;
                (!key.is_empty()).then_some(TurnKey { key, body_hash })
            }
        };
        if !self.bytes.is_empty() {
            for _ in 0..self.len(12)? {
                let (choice, call) = (self.u32()? as usize, self.u32()? as usize);
                let format = ToolFormat::named(&self.string()?).map_err(|_| Corrupt("format"))?;
                let call = choices
                    .get_mut(choice)
                    .and_then(|c| c.tool_calls.get_mut(call))
                    .ok_or(Corrupt("healed call"))?;
                call.healed_from = Some(format.parser().name());
            }
        }
        let mut echoed_calls = Vec::new();
        if !self.bytes.is_empty() {
            for _ in 0..self.len(28)? {
                let (choice, call) = (self.u32()? as usize, self.u32()? as usize);
                let echo = EchoKey {
                    canonical_hash: self.u64()?,
                    text_hash: self.u64()?,
                    default_keys: self.strings()?,
                };
                let call = choices
                    .get_mut(choice)
                    .and_then(|c| c.tool_calls.get_mut(call))
                    .ok_or(Corrupt("echo key"))?;
                call.echo = Some(echo);
            }
            for _ in 0..self.len(12)? {
                echoed_calls.push(EchoChange {
                    id: self.string()?,
                    change: intern(&self.string()?),
                    keys: self.strings()?,
                });
            }
        }
        if !self.bytes.is_empty() {
            for choice in &mut choices {
                choice.weight_spans = (0..self.len(12)?)
                    .map(|_| {
                        Ok(WeightSpan {
                            version: self.string()?,
                            start: self.u32()?,
                            end: self.u32()?,
                        })
                    })
                    .collect::<Result<_, Corrupt>>()?;
            }
        }
        if !self.bytes.is_empty() {
            for choice in &mut choices {
                if self.bool()? {
                    let from = self.u32()?;
                    let width = self.u32()?;
                    let layers = self.opt_u32()?;
                    let count = self.len(2)?;
                    let ids = self
                        .take(2 * count)?
                        .chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]))
                        .collect();
                    choice.routed_experts = Some(RoutedExperts {
                        from,
                        width,
                        layers,
                        ids,
                    });
                }
            }
        }
        let conversation = match self.bytes.is_empty() {
            true => None,
            false => {
                let messages = self.u32()?;
                let digest = self.u64()?;
                (messages != NO_CONVERSATION).then_some(ConversationDigest {
                    messages: messages as usize,
                    digest,
                })
            }
        };
        let mut images = Vec::new();
        if !self.bytes.is_empty() {
            for _ in 0..self.len(32)? {
                let image = ImageSpan {
                    sha256: self.string()?.into(),
                    media_type: self.string()?.into(),
                    offset: self.u32()? as usize,
                    length: self.u32()? as usize,
                    grid_thw: [self.u32()?, self.u32()?, self.u32()?],
                };
                if image.offset + image.length > new_prompt.len() {
                    return Err(Corrupt("image span"));
                }
                images.push(image);
            }
        }
        Ok(CommitRecord {
            start,
            new_prompt,
            images,
            history,
            next_check,
            labels: TurnLabels {
                api,
                tools_left_out,
                nudge,
                echoed_calls,
            },
            track_tree,
            choices,
            key,
            conversation,
        })
    }
    fn choice(&mut self) -> Result<RecordedChoice, Corrupt> {
        let token_ids = self.ids()?;
        let bytes = self.take(4 * token_ids.len())?;
        let logprobs = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        let finish_reason = match self.u8()? {
            0 => FinishReason::Stop,
            1 => FinishReason::Length,
            2 => FinishReason::Abort,
            _ => return Err(Corrupt("finish reason")),
        };
        let stop = match self.u8()? {
            0 => None,
            1 => Some(StopMatch::Token(self.u32()?)),
            2 => Some(StopMatch::Text(self.string()?)),
            _ => return Err(Corrupt("stop")),
        };
        Ok(RecordedChoice {
            token_ids,
            logprobs,
            finish_reason,
            stop,
            weight_version: self.opt_string()?,
            weight_spans: Vec::new(),
            routed_experts: None,
            cached_tokens: self.opt_u32()?,
            approximate: self.bool()?,
            end_token_text: self.opt_string()?,
            tool_calls: (0..self.len(12)?)
                .map(|_| {
                    Ok(IssuedToolCall {
                        id: self.string()?,
                        call_hash: self.u64()?,
                        healed_from: None,
                        echo: None,
                    })
                })
                .collect::<Result<_, Corrupt>>()?,
            fingerprints: (0..self.len(8)?)
                .map(|_| self.u64())
                .collect::<Result<_, _>>()?,
            backend: Arc::from(self.string()?),
        })
    }
}
