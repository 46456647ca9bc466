//! Every route the proxy serves, in one table: its method and pattern, who may call it
//! ([`Access`]), the API whose error shape its refusals take ([`Shape`]), and whether it runs
//! a turn. A route is registered only through [`Route::new`], which asks for its class, so a
//! route added without one does not build; each route's guard (see [`super::guard`]) then
//! decides on the route that matched, never on the request's raw path.

use super::{admin, anthropic, blobs, control, export, openai, responses, sessions, viewer};
use actix_web::{FromRequest, Handler, Responder, web};

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone: the route carries no data and changes nothing.
    Public,
    /// A client of the rollouts: the API key (or the admin key).
    Client,
    /// The operator: the admin key (the API key when no admin key is set).
    Operator,
}

/// The API whose error shape a route's refusals take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// OpenAI's `{"error": {"message", "type", "code"}}`.
    OpenAi,
    /// Anthropic's `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
}

impl Shape {
    /// `error` as a reply in this shape.
    pub fn refuse(self, error: super::ApiError) -> actix_web::HttpResponse {
        use actix_web::ResponseError;
        match self {
            Shape::OpenAi => error.error_response(),
            Shape::Anthropic => anthropic::AnthropicError::from(error).error_response(),
        }
    }
}

/// The methods routes are served by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// `GET`.
    Get,
    /// `POST`: the body, if any, is JSON.
    Post,
    /// `DELETE`.
    Delete,
}

impl Verb {
    /// The HTTP method.
    pub fn method(self) -> actix_web::http::Method {
        use actix_web::http::Method;
        match self {
            Self::Get => Method::GET,
            Self::Post => Method::POST,
            Self::Delete => Method::DELETE,
        }
    }
}

/// What the guard of a route knows of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteClass {
    /// The method it is served by.
    pub verb: Verb,
    /// Its pattern (actix's syntax: `{uuid}` is a session id).
    pub pattern: &'static str,
    /// Who may call it.
    pub access: Access,
    /// How its refusals are shaped.
    pub shape: Shape,
    /// It runs a turn: `Idempotency-Key` applies.
    pub turn: bool,
    /// It may change state: a request from another site is refused (every `POST` and
    /// `DELETE`, and the `GET`s marked so).
    pub changes_state: bool,
}

/// A route: its class and its handler.
pub struct Route {
    /// Its class.
    pub class: RouteClass,
    /// The handler, for its method.
    pub handler: actix_web::Route,
}

impl Route {
    /// A route of `access` at `pattern`, served by `handler`.
    pub fn new<F, Args>(verb: Verb, pattern: &'static str, access: Access, handler: F) -> Self
    where
        F: Handler<Args>,
        Args: FromRequest + 'static,
        F::Output: Responder + 'static,
    {
        Self {
            class: RouteClass {
                verb,
                pattern,
                access,
                shape: Shape::OpenAi,
                turn: false,
                changes_state: verb != Verb::Get,
            },
            handler: web::method(verb.method()).to(handler),
        }
    }

    /// Its refusals take Anthropic's shape.
    fn anthropic(mut self) -> Self {
        self.class.shape = Shape::Anthropic;
        self
    }

    /// It runs a turn.
    fn turn(mut self) -> Self {
        self.class.turn = true;
        self
    }

    /// A `GET` that may change state.
    fn changes_state(mut self) -> Self {
        self.class.changes_state = true;
        self
    }
}

/// Every route, in the order they are tried. A rollout's routes with more than one segment
/// come first, the turns of the three conversation APIs leading: each pattern with a session
/// id is a regex tried in turn, and a turn is the request served most often. None of those patterns matches a fixed route's path; `/{uuid}` would
/// (`/health`), so it stays last.
pub fn table() -> Vec<Route> {
    use Access::{Client, Operator, Public};
    use Verb::{Delete, Get, Post};
    vec![
        Route::new(
            Post,
            "/{uuid}/v1/chat/completions",
            Client,
            openai::chat::completions,
        )
        .turn(),
        Route::new(Post, "/{uuid}/v1/messages", Client, anthropic::messages)
            .anthropic()
            .turn(),
        Route::new(Post, "/{uuid}/v1/responses", Client, responses::create).turn(),
        Route::new(
            Post,
            "/{uuid}/v1/chat/completions/render",
            Client,
            openai::chat::render,
        ),
        Route::new(
            Post,
            "/{uuid}/v1/completions",
            Client,
            openai::completions::completions,
        )
        .turn(),
        Route::new(
            Post,
            "/{uuid}/v1/messages/count_tokens",
            Client,
            anthropic::count_tokens,
        )
        .anthropic(),
        Route::new(
            Post,
            "/{uuid}/v1/messages/render",
            Client,
            anthropic::render,
        )
        .anthropic(),
        Route::new(
            Post,
            "/{uuid}/v1/responses/render",
            Client,
            responses::render,
        ),
        Route::new(
            Get,
            "/{uuid}/v1/responses/{id}",
            Client,
            responses::retrieve,
        ),
        Route::new(Get, "/{uuid}/nodes", Client, sessions::nodes),
        Route::new(Get, "/{uuid}/divergences", Client, sessions::divergences),
        Route::new(Get, "/{uuid}/blobs/{sha256}", Client, blobs::session_blob),
        Route::new(Get, "/{uuid}/view", Client, viewer::view),
        Route::new(Post, "/{uuid}/reward", Client, sessions::reward),
        Route::new(Post, "/{uuid}/abort", Client, control::abort),
        Route::new(Get, "/{uuid}/v1/models", Client, admin::session_models),
        Route::new(
            Get,
            "/{uuid}/v1/models/{model:.+}",
            Client,
            admin::session_model,
        ),
        Route::new(Get, "/health", Public, admin::health),
        Route::new(Get, "/ui", Public, viewer::page),
        Route::new(Get, "/ui/{name}", Public, viewer::asset),
        Route::new(Get, "/v1/models", Client, admin::models),
        Route::new(Get, "/v1/models/{model:.+}", Client, admin::model),
        Route::new(Get, "/servers", Operator, admin::servers),
        Route::new(Get, "/metrics", Operator, admin::metrics),
        Route::new(Post, "/setup", Operator, admin::setup),
        Route::new(Post, "/sessions/create", Client, sessions::create),
        Route::new(Get, "/sessions", Operator, sessions::list),
        Route::new(Get, "/blobs/{sha256}", Operator, blobs::blob),
        // `delete=true` removes what it hands out.
        Route::new(Get, "/export", Operator, export::export).changes_state(),
        Route::new(Post, "/pause", Operator, control::pause),
        Route::new(Post, "/resume", Operator, control::resume),
        Route::new(Post, "/weight_version", Operator, control::weight_version),
        Route::new(Delete, "/{uuid}", Client, sessions::delete),
    ]
}

/// The class of every route, in table order (what the guard of each one is given).
pub fn classes() -> Vec<RouteClass> {
    table().into_iter().map(|route| route.class).collect()
}
