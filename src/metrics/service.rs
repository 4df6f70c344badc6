//! `/metrics` for an actix-web service (feature `actix-web`).

use actix_web::{web, HttpResponse};

use super::PrometheusHandle;

/// A `GET /metrics` resource rendering `handle` in Prometheus' text format; register it with
/// `App::service`.
///
/// ```no_run
/// # async fn f() -> std::io::Result<()> {
/// let handle = jobvisor::metrics::install_prometheus().expect("the only recorder");
/// actix_web::HttpServer::new(move || {
///     actix_web::App::new().service(jobvisor::metrics::actix_web_service(handle.clone()))
/// })
/// .bind(("127.0.0.1", 9464))?
/// .run()
/// .await
/// # }
/// ```
pub fn actix_web_service(handle: PrometheusHandle) -> actix_web::Resource {
    web::resource("/metrics").route(web::get().to(move || {
        let page = handle.render();
        async move {
            HttpResponse::Ok()
                .content_type("text/plain; version=0.0.4; charset=utf-8")
                .body(page)
        }
    }))
}
