//! A client of a proxy process for the tests that start, kill and restart them: sessions,
//! chat turns that carry their conversation on, and nodes as text (to compare byte for byte).

use serde_json::{Value, json};

/// A client of one proxy at `base`.
pub struct Client {
    pub base: String,
    pub http: reqwest::Client,
}

impl Client {
    /// A client of the proxy listening on `port`.
    pub fn on(port: u16) -> Self {
        Client {
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        }
    }

    pub async fn post(&self, path: &str, body: Value) -> Value {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
        response.json().await.unwrap()
    }

    pub async fn get_json(&self, path: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    pub async fn nodes_text(&self, uuid: &str) -> (u16, String) {
        let response = self
            .http
            .get(format!("{}/{uuid}/nodes", self.base))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    /// A turn continuing `messages` (the reply is appended to them).
    pub async fn turn(&self, uuid: &str, messages: &mut Vec<Value>, user: &str) {
        assert_eq!(
            self.try_turn(uuid, messages, user).await,
            200,
            "{uuid}: a turn"
        );
    }

    /// A chat turn of `uuid` continuing `messages` with `user`: its status (on a 200 the
    /// question and the reply are appended to `messages`, otherwise nothing is).
    pub async fn try_turn(&self, uuid: &str, messages: &mut Vec<Value>, user: &str) -> u16 {
        let mut asked = messages.clone();
        asked.push(json!({"role": "user", "content": user}));
        let response = self
            .http
            .post(format!("{}/{uuid}/v1/chat/completions", self.base))
            .json(&json!({ "messages": asked }))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        if status == 200 {
            let reply: Value = response.json().await.unwrap();
            asked.push(reply["choices"][0]["message"].clone());
            *messages = asked;
        }
        status
    }

    pub async fn session(&self) -> String {
        let created = self.post("/sessions/create", json!({})).await;
        created["uuid"].as_str().unwrap().to_string()
    }

    /// Deletes the session `uuid` (which must succeed).
    pub async fn delete_session(&self, uuid: &str) {
        let response = self
            .http
            .delete(format!("{}/{uuid}", self.base))
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{uuid}: {}",
            response.status()
        );
    }
}
