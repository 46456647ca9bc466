//! `rollout-proxy check-template`: before a run, whether a model's chat template keeps one node
//! per rollout, and where it rewrites history.
//!
//! A built-in set of conversation shapes ([`shapes`]) is run as sessions through the real turn
//! code ([`simulate`]): each assistant message sampled as the template writes it, the reply
//! shaped and committed, sent back on the next turn. For every turn transition the report says
//! whether `history: "sampled"` (the default) extended the node, and whether the template's own
//! render of the next prompt extends the previous prompt plus the sampled reply, or where it
//! rewrites it ([`rewrite`]); which tool-call format the template writes
//! ([`crate::tools::detect`]); optionally, whether `transformers` renders every prompt the same
//! ([`reference`]). [`Report::table`] is for people, the report's JSON for machines, and
//! [`Verdict::exit_code`] for CI.

mod reference;
mod rewrite;
mod scripted;
pub(crate) mod shapes;
mod simulate;
mod table;

pub use reference::ReferenceError;
pub use rewrite::Rewrite;
pub use simulate::Transition;

use crate::template::{TemplateError, TemplateSpec, load_template};
use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::turn::TurnContext;
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;

/// Why a model could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The tokenizer did not load.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The template did not load.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The reference renderer did not run.
    #[error(transparent)]
    Reference(#[from] ReferenceError),
}

/// Checks the model in `tokenizer_dir` with its own template, or `chat_template` (a bundled
/// name, a file or a folder); with `reference_python`, also against `transformers`.
pub fn check_model(
    tokenizer_dir: &Path,
    chat_template: Option<&str>,
    reference_python: Option<&Path>,
) -> Result<Report, CheckError> {
    let tokenizer = Tokenizer::from_path(tokenizer_dir)?;
    let spec = chat_template.map(TemplateSpec::parse);
    let model_dir = Some(tokenizer_dir).filter(|dir| dir.is_dir());
    let template = load_template(spec.as_ref(), model_dir)?;
    let ctx = TurnContext::new(Arc::new(template), Arc::new(tokenizer));
    let reference = reference_python.map(|python| (python, tokenizer_dir));
    Ok(check(&ctx, reference)?)
}

/// The outcome of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Every shape renders, and sampled history keeps one node on each.
    Pass,
    /// Sampled history keeps one node wherever the template renders, but some shape does not
    /// render (a template without tools, say) or the tool format reads no call back.
    Warn,
    /// Sampled history starts a new node somewhere, or the render differs from transformers'.
    Fail,
}

impl Verdict {
    /// 0 for pass and warn (1 for warn with `strict`), 1 for fail.
    pub fn exit_code(self, strict: bool) -> i32 {
        match self {
            Self::Pass => 0,
            Self::Warn if !strict => 0,
            Self::Warn | Self::Fail => 1,
        }
    }
}

/// One shape's results.
#[derive(Debug, Clone, Serialize)]
pub struct ShapeReport {
    /// The shape's name.
    pub name: &'static str,
    /// What it exercises.
    pub description: &'static str,
    /// Why it did not render, if it did not.
    pub error: Option<String>,
    /// Whether `transformers` rendered every prompt the same (`None`: not compared).
    pub matches_reference: Option<bool>,
    /// The first difference from `transformers`, if any.
    pub reference_difference: Option<String>,
    /// Calls the template wrote that the session's tool format did not read back.
    pub calls_unread: usize,
    /// One per sampled turn.
    pub transitions: Vec<Transition>,
}

impl ShapeReport {
    /// Sampled history kept one node across every transition.
    pub fn keeps_node(&self) -> bool {
        self.transitions.iter().all(|t| t.keeps_node)
    }

    /// The template's own render only ever appended.
    pub fn append_only(&self) -> bool {
        self.transitions.iter().all(|t| t.rewrite.is_none())
    }
}

/// A template's check.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The template's name (bundled name, file or model folder).
    pub template: String,
    /// The tool-call format the template writes, if a registered one reads it back.
    pub tool_format_written: Option<&'static str>,
    /// The format sessions created without `tool_parser` take (the shapes ran with it).
    pub default_tool_parser: String,
    /// Sessions render only the end of a conversation: it gave the same prompt as the whole
    /// conversation on every turn of the shapes that allowed it.
    pub tail_renders: bool,
    /// Every shape's results.
    pub shapes: Vec<ShapeReport>,
    /// The outcome.
    pub verdict: Verdict,
    /// The outcome in a sentence: which history policy keeps one node, and what rewrites.
    pub summary: String,
}

/// Checks the template and tokenizer of `ctx`; with `reference` (a Python with
/// `transformers`, and the model folder it loads the tokenizer from), also compares renders.
pub fn check(
    ctx: &TurnContext,
    reference: Option<(&Path, &Path)>,
) -> Result<Report, ReferenceError> {
    let format = ctx.default_tool_format.clone();

    let written = match ctx.harmony {
        true => Some("harmony"),
        false => crate::tools::detect::written_format(&ctx.template)
            .ok()
            .flatten(),
    };
    let runs: Vec<_> = shapes::all()
        .into_iter()
        .map(|shape| {
            let run = simulate::run(ctx, &format, &shape);
            (shape, run)
        })
        .collect();
    // Every prompt of every shape, rendered by transformers in one process.
    let mut differences = match reference {
        Some((python, dir)) => {
            let renders: Vec<_> = runs.iter().flat_map(|(_, run)| &run.renders).collect();
            Some(reference::compare(python, dir, &ctx.template, &renders)?.into_iter())
        }
        None => None,
    };
    let shapes: Vec<ShapeReport> = runs
        .into_iter()
        .map(|(shape, run)| {
            let compared: Option<Vec<Option<String>>> = differences
                .as_mut()
                .map(|all| all.by_ref().take(run.renders.len()).collect());
            ShapeReport {
                name: shape.name,
                description: shape.description,
                error: run.error,
                matches_reference: compared.as_ref().map(|d| d.iter().all(Option::is_none)),
                reference_difference: compared.into_iter().flatten().flatten().next(),
                calls_unread: run.calls_unread,
                transitions: run.transitions,
            }
        })
        .collect();
    let verdict = verdict(&shapes);
    Ok(Report {
        template: ctx.template.name().to_string(),
        tool_format_written: written,
        default_tool_parser: format.name().to_string(),
        tail_renders: tail_renders_agree(shapes.iter().flat_map(|s| &s.transitions)),
        summary: summary(&shapes, verdict),
        shapes,
        verdict,
    })
}

/// Whether rendering only the end of a conversation gives every prompt a full render gives, on
/// every turn of every shape the template renders that allows it (and there is one): what
/// lets sessions render tail-only ([`crate::turn::TailRender`]).
pub fn tail_renders_hold(ctx: &TurnContext) -> bool {
    let format = ctx.default_tool_format.clone();
    let runs: Vec<simulate::ShapeRun> = shapes::all()
        .iter()
        .map(|shape| simulate::run(ctx, &format, shape))
        .collect();
    tail_renders_agree(runs.iter().flat_map(|run| &run.transitions))
}

/// Some transition allowed a tail render, and every one that did agreed with the full render.
fn tail_renders_agree<'a>(transitions: impl Iterator<Item = &'a Transition>) -> bool {
    let outcomes: Vec<bool> = transitions.filter_map(|t| t.tail_render).collect();
    !outcomes.is_empty() && outcomes.iter().all(|&agrees| agrees)
}

fn verdict(shapes: &[ShapeReport]) -> Verdict {
    let differs = shapes.iter().any(|s| s.matches_reference == Some(false));
    if differs || shapes.iter().any(|s| s.error.is_none() && !s.keeps_node()) {
        Verdict::Fail
    } else if shapes
        .iter()
        .any(|s| s.error.is_some() || s.calls_unread > 0)
    {
        Verdict::Warn
    } else {
        Verdict::Pass
    }
}

fn summary(shapes: &[ShapeReport], verdict: Verdict) -> String {
    let rendered: Vec<&ShapeReport> = shapes.iter().filter(|s| s.error.is_none()).collect();
    let mut kinds: Vec<&str> = rendered
        .iter()
        .flat_map(|s| &s.transitions)
        .filter_map(|t| t.rewrite.as_ref().map(|r| r.kind))
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    let template_history = match kinds.is_empty() {
        true => "history \"template\" keeps one node too (the template only appends)".to_string(),
        false => format!(
            "history \"template\" starts new nodes where the template rewrites history ({})",
            kinds.join(", ")
        ),
    };
    let failed: Vec<&str> = shapes
        .iter()
        .filter(|s| s.error.is_some())
        .map(|s| s.name)
        .collect();
    let unrendered = match failed.is_empty() {
        true => String::new(),
        false => format!("; the template does not render {}", failed.join(", ")),
    };
    match verdict {
        Verdict::Fail => format!(
            "history \"sampled\" does not keep one node on every shape, or transformers renders \
             differently{unrendered}"
        ),
        _ => format!(
            "history \"sampled\" (the default) keeps one node on every shape it renders; \
             {template_history}{unrendered}"
        ),
    }
}
