//! `worklease elect --health-addr HOST:PORT`: health endpoints for a
//! supervisor or an orchestrator (client-go's `HealthzAdaptor`), on axum.
//!
//! * `GET /livez`: 200 while the process campaigns, leads or stands by (a
//!   standby is alive: kubernetes#70971, ARO-HCP#6503);
//! * `GET /readyz`: 200 while this process leads, 503 otherwise (route
//!   traffic to the leader only);
//! * `GET /leader`: who leads, as one JSON object of `worklease leader
//!   --json` (read from the store at each request; 503 when the store
//!   fails).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State as Shared;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use worklease::election::Elector;
use worklease::WorkId;

use crate::exit::{self, Failure};
use crate::leader::leader_json;

/// What the endpoints report.
pub struct Health {
    leading: AtomicBool,
    elector: Elector,
    election: WorkId,
}

impl Health {
    /// Marks this process leading (true) or not.
    pub fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::SeqCst);
    }
}

/// Binds `addr` now (a busy or bad address fails at start, exit 69, not
/// later) and serves the endpoints on a task of their own.
pub async fn serve(
    addr: SocketAddr,
    elector: Elector,
    election: WorkId,
) -> Result<Arc<Health>, Failure> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        Failure::new(
            exit::UNAVAILABLE,
            format!("cannot serve health endpoints on {addr}: {e}"),
        )
    })?;
    let health = Arc::new(Health {
        leading: AtomicBool::new(false),
        elector,
        election,
    });
    let app = Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/leader", get(leader))
        .with_state(health.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "the health endpoints stopped");
        }
    });
    tracing::info!(%addr, "serving health endpoints (/livez, /readyz, /leader)");
    Ok(health)
}

async fn readyz(Shared(health): Shared<Arc<Health>>) -> Response {
    if health.leading.load(Ordering::SeqCst) {
        (StatusCode::OK, "leading\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "standby\n").into_response()
    }
}

async fn leader(Shared(health): Shared<Arc<Health>>) -> Response {
    let state = match health.elector.leader().await {
        Ok(state) => state,
        Err(e) => {
            let message = format!("{}\n", Failure::from(e).message);
            return (StatusCode::SERVICE_UNAVAILABLE, message).into_response();
        }
    };
    match leader_json(&health.election, state.as_ref()) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(f) => (StatusCode::INTERNAL_SERVER_ERROR, f.message).into_response(),
    }
}
