//! A scripted mock Kubernetes API server for tests (`tower_test::mock::pair`): every request's
//! method, URI (with query), content type and JSON body is asserted against the script, and the
//! server answers with Kubernetes-shaped JSON. Used by the actuator's sink tests and the
//! controller's tests (feature `testing`, for dev-dependencies only).

// Test support: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::pin::pin;

use http::header::CONTENT_TYPE;
use http::{Method, Request, Response};
use kube::client::Body;
use kube::Client;
use serde_json::Value;

/// One request the mock server expects and its answer.
pub struct Exchange {
    pub method: Method,
    pub uri: String,
    pub content_type: Option<&'static str>,
    /// The expected JSON body (after the server's normalization), `None`: no body.
    pub body: Option<Value>,
    pub status: u16,
    pub response: Value,
    /// How long the server takes to answer (after `arrived` is notified).
    pub delay: std::time::Duration,
    /// Notified when the request has arrived and been checked.
    pub arrived: Option<std::sync::Arc<tokio::sync::Notify>>,
}

impl Exchange {
    /// The same exchange answered `delay` after the request arrived, notifying `arrived` on
    /// arrival: a slow API server, for what happens while a call is in flight.
    pub fn slow(
        mut self,
        delay: std::time::Duration,
        arrived: std::sync::Arc<tokio::sync::Notify>,
    ) -> Self {
        self.delay = delay;
        self.arrived = Some(arrived);
        self
    }
}

/// A GET of `uri` answered with `status` and `response`.
pub fn get(uri: &str, status: u16, response: Value) -> Exchange {
    Exchange {
        method: Method::GET,
        uri: uri.to_string(),
        content_type: None,
        body: None,
        status,
        response,
        delay: std::time::Duration::ZERO,
        arrived: None,
    }
}

/// A PATCH of `uri` with `content_type` and `body`, answered with `status` and `response`.
pub fn patch(
    uri: &str,
    content_type: &'static str,
    body: Value,
    status: u16,
    response: Value,
) -> Exchange {
    Exchange {
        method: Method::PATCH,
        uri: uri.to_string(),
        content_type: Some(content_type),
        body: Some(body),
        status,
        response,
        delay: std::time::Duration::ZERO,
        arrived: None,
    }
}

/// Serves `script` in order, asserting every request, then asserts that no request follows.
pub fn serve(script: Vec<Exchange>) -> (Client, tokio::task::JoinHandle<()>) {
    serve_normalized(script, |_| {})
}

/// Like [`serve`], with every request body passed through `normalize` before the comparison
/// (e.g. to replace timestamps the client generates).
pub fn serve_normalized(
    script: Vec<Exchange>,
    normalize: fn(&mut Value),
) -> (Client, tokio::task::JoinHandle<()>) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(async move {
        let mut handle = pin!(handle);
        for (i, ex) in script.into_iter().enumerate() {
            let (request, send) = handle
                .next_request()
                .await
                .unwrap_or_else(|| panic!("request #{i} ({} {}) never came", ex.method, ex.uri));
            assert_eq!(request.method(), ex.method, "method of request #{i}");
            assert_eq!(request.uri().to_string(), ex.uri, "uri of request #{i}");
            let content_type = request
                .headers()
                .get(CONTENT_TYPE)
                .map(|v| v.to_str().unwrap().to_string());
            assert_eq!(
                content_type.as_deref(),
                ex.content_type,
                "content type of request #{i}"
            );
            let bytes = request.into_body().collect_bytes().await.unwrap();
            match ex.body {
                Some(expected) => {
                    let mut got: Value = serde_json::from_slice(&bytes).unwrap();
                    normalize(&mut got);
                    assert_eq!(got, expected, "body of request #{i}");
                }
                None => assert!(bytes.is_empty(), "request #{i} has a body"),
            }
            if let Some(arrived) = &ex.arrived {
                arrived.notify_one();
            }
            tokio::time::sleep(ex.delay).await;
            send.send_response(json_response(ex.status, &ex.response));
        }
        if let Some((request, _)) = handle.next_request().await {
            panic!("unexpected request {} {}", request.method(), request.uri());
        }
    });
    (Client::new(service, "default"), server)
}

/// A JSON response with `status`.
pub fn json_response(status: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}
