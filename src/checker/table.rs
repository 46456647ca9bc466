//! The report as a table a person reads.

use super::{Report, ShapeReport, Verdict};
use std::fmt::Write;

impl Report {
    /// The report as text: one row per shape, then the verdict.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let written = self
            .tool_format_written
            .unwrap_or("no format a parser reads");
        let _ = writeln!(out, "template    {}", self.template);
        let _ = writeln!(
            out,
            "tool calls  the template writes {written}; sessions default to {}",
            self.default_tool_parser
        );
        let tails: Vec<bool> = self
            .shapes
            .iter()
            .flat_map(|s| &s.transitions)
            .filter_map(|t| t.tail_render)
            .collect();
        let agreed = tails.iter().filter(|&&agrees| agrees).count();
        let _ = writeln!(
            out,
            "tail render {}: the prompt rendered from the conversation's end equals the full \
             render on {agreed} of {} turns\n",
            if self.tail_renders { "on" } else { "off" },
            tails.len()
        );
        let rows: Vec<[String; 5]> = self.shapes.iter().map(row).collect();
        let header = [
            "shape",
            "renders",
            "transformers",
            "one node (sampled)",
            "template history",
        ]
        .map(str::to_string);
        let widths: Vec<usize> = (0..4)
            .map(|c| {
                rows.iter()
                    .chain([&header])
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in [&header].into_iter().chain(&rows) {
            for (cell, width) in row.iter().zip(&widths) {
                let _ = write!(out, "{cell:<width$}  ");
            }
            let _ = writeln!(out, "{}", row[4]);
        }
        let verdict = match self.verdict {
            Verdict::Pass => "pass",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        };
        let _ = writeln!(out, "\nverdict: {verdict}: {}", self.summary);
        out
    }
}

fn row(shape: &ShapeReport) -> [String; 5] {
    let reference = match (shape.matches_reference, &shape.reference_difference) {
        (None, _) => "-".to_string(),
        (Some(true), _) => "same".to_string(),
        (Some(false), Some(difference)) => difference.chars().take(60).collect(),
        (Some(false), None) => "differs".to_string(),
    };
    if let Some(error) = &shape.error {
        let error: String = error.chars().take(70).collect();
        return [
            shape.name.into(),
            "no".into(),
            reference,
            "-".into(),
            format!("({error})"),
        ];
    }
    let turns = shape.transitions.len();
    let kept = shape.transitions.iter().filter(|t| t.keeps_node).count();
    let sampled = match kept == turns {
        true if turns == 1 => "yes (1 turn)".to_string(),
        true => format!("yes ({turns} turns)"),
        false => format!("no: {kept} of {turns} turns"),
    };
    let mut history: Vec<String> = shape
        .transitions
        .iter()
        .filter_map(|t| {
            let rewrite = t.rewrite.as_ref()?;
            let message = rewrite
                .message
                .map_or(String::new(), |m| format!(" in message {m}"));
            Some(format!(
                "turn {}: {}{message} at token {}",
                t.turn, rewrite.kind, rewrite.token
            ))
        })
        .collect();
    if history.is_empty() {
        history.push("appends".into());
    }
    match shape.calls_unread {
        0 => {}
        1 => history.push("1 call not returned".into()),
        n => history.push(format!("{n} calls not returned")),
    }
    [
        shape.name.into(),
        "yes".into(),
        reference,
        sampled,
        history.join("; "),
    ]
}
