//! Fidelity telemetry: `GET /{uuid}/divergences` shows each turn that could not extend a node,
//! with where its prompt parted from the closest node, as ids and text on both sides.

mod common;

use common::mock_worker::Sample;
use common::{Proxy, chars};
use serde_json::json;

#[tokio::test]
async fn an_edited_reply_is_reported_where_it_parted_from_the_node() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let (_, none) = proxy.get(&format!("/{uuid}/divergences")).await;
    assert_eq!(none["divergences"], json!([]));
    let question = json!({"role": "user", "content": "hi"});
    proxy
        .turn(
            &uuid,
            Sample::stop(chars("hello there")),
            json!({"messages": [question]}),
        )
        .await;
    let edited = json!({"messages": [question,
        {"role": "assistant", "content": "hello THERE"},
        {"role": "user", "content": "and?"}]});
    proxy.turn(&uuid, Sample::stop(chars("ok")), edited).await;
    let (status, body) = proxy.get(&format!("/{uuid}/divergences")).await;
    assert_eq!(status, 200);
    let reports = body["divergences"].as_array().unwrap();
    assert_eq!(reports.len(), 1, "{body}");
    let report = &reports[0];
    assert_eq!(report["node"], 1);
    assert_eq!(report["reason"], "unmatched_assistant_message");
    assert_eq!(report["closest_node"], 0);
    let expected = report["expected"]["text"].as_str().unwrap();
    let received = report["received"]["text"].as_str().unwrap();
    // The char model: one token per character, so the texts show the very difference.
    assert!(expected.contains("hello there"), "{expected}");
    assert!(received.contains("hello THERE"), "{received}");
    let nodes = proxy.nodes(&uuid).await;
    let position = report["position"].as_u64().unwrap() as usize;
    let (old, new) = (
        nodes[0]["tokens"].as_array().unwrap(),
        nodes[1]["tokens"].as_array().unwrap(),
    );
    assert_eq!(old[..position], new[..position]);
    assert_ne!(old[position], new[position]);
    assert_eq!(
        nodes[1]["metadata"]["divergence"]["reason"],
        "unmatched_assistant_message"
    );
}
