//! The tool-call formats a session may choose, by name: one table, read by session creation
//! (which validates the name and lists the choices) and by the fuzz targets.

use super::{
    AutoParser, DeepSeekV3Parser, Gemma4Parser, HarmonyParser, HermesParser, Llama3JsonParser,
    MistralParser, PythonicParser, QwenXmlParser, ToolParser,
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::Arc;

/// One registered format: its name, other names it answers to, and how to build it.
#[derive(Debug)]
pub struct ParserEntry {
    /// The name listed to clients.
    pub name: &'static str,
    /// Other accepted spellings (vLLM's and SGLang's parser names).
    pub aliases: &'static [&'static str],
    build: fn() -> Arc<dyn ToolParser>,
}

impl ParserEntry {
    /// A fresh parser of this format.
    pub fn build(&self) -> Arc<dyn ToolParser> {
        (self.build)()
    }

    fn answers_to(&self, name: &str) -> bool {
        self.name == name || self.aliases.contains(&name)
    }
}

/// Every format, the default first.
pub const PARSERS: &[ParserEntry] = &[
    ParserEntry {
        name: "hermes",
        aliases: &["qwen"],
        build: || Arc::new(HermesParser),
    },
    ParserEntry {
        name: "qwen3_coder",
        aliases: &["qwen_xml"],
        build: || Arc::new(QwenXmlParser),
    },
    ParserEntry {
        name: "mistral",
        aliases: &[],
        build: || Arc::new(MistralParser),
    },
    ParserEntry {
        name: "llama3_json",
        aliases: &["llama3"],
        build: || Arc::new(Llama3JsonParser),
    },
    ParserEntry {
        name: "pythonic",
        aliases: &[],
        build: || Arc::new(PythonicParser),
    },
    ParserEntry {
        name: "gemma4",
        aliases: &[],
        build: || Arc::new(Gemma4Parser),
    },
    ParserEntry {
        name: "deepseek_v3",
        aliases: &["deepseek"],
        build: || Arc::new(DeepSeekV3Parser),
    },
    ParserEntry {
        name: "harmony",
        aliases: &["openai", "gpt_oss"],
        build: || Arc::new(HarmonyParser),
    },
    ParserEntry {
        name: "auto",
        aliases: &[],
        build: || Arc::new(AutoParser),
    },
];

/// The entry registered under `name` (a name or an alias).
pub fn lookup(name: &str) -> Option<&'static ParserEntry> {
    PARSERS.iter().find(|entry| entry.answers_to(name))
}

/// Every accepted name, aliases after their format's name: `hermes (qwen), qwen3_coder, …`.
pub fn accepted_names() -> String {
    PARSERS
        .iter()
        .map(|entry| match entry.aliases {
            [] => entry.name.to_string(),
            aliases => format!("{} ({})", entry.name, aliases.join(", ")),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A session's tool-call format: the name the client chose and the parser it was resolved to
/// once, at session creation. Serialised as the name.
#[derive(Clone)]
pub struct ToolFormat {
    name: String,
    parser: Arc<dyn ToolParser>,
}

/// A name no format answers to.
#[derive(Debug, thiserror::Error)]
#[error("unknown tool_parser '{name}' (available: {available})")]
pub struct UnknownFormat {
    name: String,
    available: String,
}

impl ToolFormat {
    /// The format registered under `name`.
    pub fn named(name: &str) -> Result<Self, UnknownFormat> {
        let entry = lookup(name).ok_or_else(|| UnknownFormat {
            name: name.to_string(),
            available: accepted_names(),
        })?;
        Ok(Self {
            name: name.to_string(),
            parser: entry.build(),
        })
    }

    /// The name as the client chose it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The parser of this format.
    pub fn parser(&self) -> &Arc<dyn ToolParser> {
        &self.parser
    }
}

impl Default for ToolFormat {
    fn default() -> Self {
        Self {
            name: PARSERS[0].name.to_string(),
            parser: PARSERS[0].build(),
        }
    }
}

impl std::fmt::Debug for ToolFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl PartialEq for ToolFormat {
    fn eq(&self, other: &Self) -> bool {
        self.parser.name() == other.parser.name()
    }
}

impl Eq for ToolFormat {}

impl Serialize for ToolFormat {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.name)
    }
}

impl<'de> Deserialize<'de> for ToolFormat {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Self::named(&name).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_and_alias_builds_the_parser_that_names_itself_so() {
        for entry in PARSERS {
            assert_eq!(entry.build().name(), entry.name);
            for &alias in entry.aliases {
                assert_eq!(lookup(alias).unwrap().name, entry.name);
            }
        }
        assert!(lookup("klingon").is_none());
        let error = ToolFormat::named("klingon").unwrap_err().to_string();
        assert!(error.contains("hermes (qwen)") && error.contains("deepseek_v3 (deepseek)"));
    }

    #[test]
    fn a_format_keeps_the_name_it_was_chosen_by() {
        let format: ToolFormat = serde_json::from_str("\"qwen\"").unwrap();
        assert_eq!(format.name(), "qwen");
        assert_eq!(format.parser().name(), "hermes");
        assert_eq!(serde_json::to_string(&format).unwrap(), "\"qwen\"");
        assert_eq!(format, ToolFormat::default());
    }
}
