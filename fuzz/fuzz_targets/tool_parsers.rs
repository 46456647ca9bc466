//! Every tool-call parser on arbitrary text, with and without healing: never panics, and text
//! with no promoted call comes back unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rollout_proxy::tools::registry::PARSERS;
use rollout_proxy::tools::{DeclaredTools, Promoter};
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let tools = serde_json::json!([
        {"type": "function", "function": {"name": "search", "parameters": {"properties": {"q": {"type": "string"}}, "required": ["q"]}}},
        {"type": "function", "function": {"name": "Bash"}},
    ]);
    let tools = DeclaredTools::new(serde_json::from_value(tools).unwrap())
        .unwrap()
        .map(Arc::new);
    let names = vec!["search".to_string(), "Bash".to_string()];
    for heal in [false, true] {
        let promoter = Promoter::new(tools.as_ref(), &names, heal);
        for entry in PARSERS {
            let parsed = entry.build().parse(&text, &promoter);
            for call in &parsed.calls {
                let arguments: serde_json::Value =
                    serde_json::from_str(&call.arguments).expect("arguments are JSON");
                assert!(arguments.is_object());
            }
            if parsed.calls.is_empty() && !text.trim().is_empty() {
                assert_eq!(parsed.content.as_deref(), Some(&*text));
            }
        }
    }
});
