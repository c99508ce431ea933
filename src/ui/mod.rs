//! `petting ui`: a web dashboard over run stores, served on 127.0.0.1 from the binary.
//! It reads only the stores (local or object storage) and writes nothing; the page asks
//! again every two seconds, so a running run's new commits appear without a reload.
//!
//! ```text
//!  GET  /                 the page (assets/ui/index.html)
//!  GET  /assets/<file>    its script, style and charting library (uPlot), all embedded
//!  GET  /api/runs         every run under the sources: name, headline, commits
//!  GET  /api/panels       the charts and the SQL behind each (inspect::panels)
//!  POST /api/series       {run, queries}: each query's (x, series, y) rows as series
//!  POST /api/sql          {run, query}: columns and rows
//!  POST /api/config       {run}: run.yaml as frozen, and where the run came from
//!  POST /api/tree         {run, iteration, task}: the task's sampling tree, token by token
//!  POST /api/compare      {runs}: held-out success per method and task over the runs, as
//!                         `petting compare --format json` gives it
//! ```

mod assets;
mod tree;

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::inspect::compare;
use crate::inspect::panels::{OVERLAP, SPANS, panels};
use crate::inspect::report::series;
use crate::pipeline::headline::Headline;
use crate::sql::RunSql;
use crate::store::RunStore;
use crate::store::status::stage_statuses;

/// How many folders below a source runs are looked for (as `petting runs`).
const DEPTH: usize = 4;
/// The largest request body the page sends (an edited query).
const REQUEST_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot serve the dashboard on {address}: {source}")]
    Bind { address: String, source: std::io::Error },

    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

/// The runs a dashboard shows: each source is a run or a folder (or prefix) of runs,
/// listed again at every request so runs started later appear.
#[derive(Debug, Clone)]
pub struct Dashboard {
    sources: Vec<String>,
}

impl Dashboard {
    /// Checks that every source can be listed: a malformed URL, an unknown scheme or
    /// missing credentials fail here, not in the page. A folder that does not exist yet
    /// holds no runs until one starts there.
    pub async fn new(sources: Vec<String>) -> Result<Dashboard, Error> {
        for source in &sources {
            RunStore::runs_under(source, DEPTH).await?;
        }
        Ok(Dashboard { sources })
    }

    /// How many runs the sources hold now.
    pub async fn run_count(&self) -> Result<usize, Error> {
        Ok(self.runs().await?.len())
    }

    async fn runs(&self) -> Result<Vec<RunStore>, crate::store::Error> {
        let mut runs = Vec::new();
        for source in &self.sources {
            runs.extend(RunStore::runs_under(source, DEPTH).await?);
        }
        runs.dedup_by(|a, b| a.url() == b.url());
        Ok(runs)
    }

    /// The run named `url`, if it is one of the dashboard's: the page reads no other store.
    async fn run(&self, url: &str) -> Result<RunStore, Refusal> {
        let runs = self.runs().await.map_err(Refusal::internal)?;
        runs.into_iter()
            .find(|r| r.url() == url)
            .ok_or_else(|| Refusal::new(404, format!("{url} is not one of this dashboard's runs")))
    }
}

/// Binds `host:port` (port 0: any free one).
pub async fn bind(host: &str, port: u16) -> Result<tokio::net::TcpListener, Error> {
    let address = format!("{host}:{port}");
    tokio::net::TcpListener::bind(&address).await.map_err(|source| Error::Bind { address, source })
}

/// Answers requests on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, dashboard: Dashboard) {
    let dashboard = Arc::new(dashboard);
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let dashboard = Arc::clone(&dashboard);
        tokio::spawn(async move {
            let service = service_fn(move |request| answer(request, Arc::clone(&dashboard)));
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

type Reply = Response<Full<Bytes>>;

/// A request the dashboard does not answer, and why.
#[derive(Debug)]
struct Refusal {
    status: u16,
    message: String,
}

impl Refusal {
    fn new(status: u16, message: impl Into<String>) -> Refusal {
        Refusal { status, message: message.into() }
    }

    fn internal(error: impl std::fmt::Display) -> Refusal {
        Refusal::new(500, error.to_string())
    }
}

async fn answer(request: hyper::Request<Incoming>, dashboard: Arc<Dashboard>) -> Result<Reply, Infallible> {
    Ok(match route(request, &dashboard).await {
        Ok(reply) => reply,
        Err(refusal) => json_reply(refusal.status, &json!({"error": refusal.message})),
    })
}

async fn route(request: hyper::Request<Incoming>, dashboard: &Dashboard) -> Result<Reply, Refusal> {
    let path = request.uri().path().to_string();
    // A page of another site can post a form here but not JSON (that needs the CORS
    // approval this server never gives), so only JSON is answered.
    let json = request
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if request.method() == Method::POST && !json {
        return Err(Refusal::new(415, "the dashboard's API takes JSON (content-type: application/json)"));
    }
    match (request.method(), path.as_str()) {
        (&Method::GET, "/") => Ok(assets::reply("index.html").expect("the page is embedded")),
        (&Method::GET, asset) if asset.starts_with("/assets/") => {
            assets::reply(&asset["/assets/".len()..]).ok_or_else(|| Refusal::new(404, format!("no asset {asset}")))
        }
        (&Method::GET, "/api/runs") => Ok(json_reply(200, &runs(dashboard).await?)),
        (&Method::GET, "/api/panels") => Ok(json_reply(200, &panel_list())),
        (&Method::POST, "/api/series") => {
            let body: SeriesRequest = read_json(request.into_body()).await?;
            Ok(json_reply(200, &charted(&dashboard.run(&body.run).await?, &body.queries).await?))
        }
        (&Method::POST, "/api/sql") => {
            let body: SqlRequest = read_json(request.into_body()).await?;
            let sql = RunSql::open(&dashboard.run(&body.run).await?).await.map_err(Refusal::internal)?;
            Ok(json_reply(200, &table(&sql, &body.query).await?))
        }
        (&Method::POST, "/api/config") => {
            let body: RunRequest = read_json(request.into_body()).await?;
            Ok(json_reply(200, &provenance(&dashboard.run(&body.run).await?).await?))
        }
        (&Method::POST, "/api/tree") => {
            let body: TreeRequest = read_json(request.into_body()).await?;
            let store = dashboard.run(&body.run).await?;
            let found = tree::task_tree(&store, body.iteration, &body.task)
                .await
                .map_err(|e| Refusal::new(404, e.to_string()))?;
            Ok(json_reply(200, &found))
        }
        (&Method::POST, "/api/compare") => {
            let body: CompareRequest = read_json(request.into_body()).await?;
            let mut runs = Vec::new();
            for url in &body.runs {
                let store = dashboard.run(url).await?;
                runs.push(compare::read_run(&store).await.map_err(|e| Refusal::new(400, format!("{url}: {e}")))?);
            }
            compare::label_runs(&mut runs, &[]).map_err(Refusal::internal)?;
            Ok(json_reply(200, &compare::cells(&compare::table(&runs, None))))
        }
        (method, _) => Err(Refusal::new(404, format!("the dashboard does not serve {method} {path}"))),
    }
}

#[derive(Deserialize)]
struct RunRequest {
    run: String,
}

#[derive(Deserialize)]
struct SqlRequest {
    run: String,
    query: String,
}

#[derive(Deserialize)]
struct SeriesRequest {
    run: String,
    queries: Vec<String>,
}

#[derive(Deserialize)]
struct CompareRequest {
    runs: Vec<String>,
}

#[derive(Deserialize)]
struct TreeRequest {
    run: String,
    iteration: u32,
    task: String,
}

/// Every run with where it stands; `commits` changes with each commit, which is how the
/// page knows to redraw a run's charts.
async fn runs(dashboard: &Dashboard) -> Result<Value, Refusal> {
    let mut out = Vec::new();
    for store in dashboard.runs().await.map_err(Refusal::internal)? {
        out.push(run_entry(&store).await);
    }
    Ok(Value::Array(out))
}

async fn run_entry(store: &RunStore) -> Value {
    let url = store.url();
    let markers = match store.markers().await {
        Ok(markers) => markers,
        Err(e) => return json!({"url": url, "name": url, "error": e.to_string()}),
    };
    let config = match crate::config::of_run(store).await {
        Ok(config) => config,
        Err(e) => return json!({"url": url, "name": url, "commits": markers.len(), "error": e.to_string()}),
    };
    let running = store.running().await.unwrap_or_default();
    let headline = Headline::of(&config, &stage_statuses(&markers), &markers, &running);
    json!({"url": url, "name": config.run_name(), "commits": markers.len(), "headline": headline.as_json()})
}

/// The charts, and the queries of the time line: every commit as a span of seconds from
/// the run's start, and how long sampling ran beside training.
fn panel_list() -> Value {
    let charts: Vec<Value> = panels()
        .iter()
        .map(|p| {
            json!({
                "id": p.file.trim_end_matches(".png"),
                "title": p.title,
                "x_label": p.x_label,
                "y_label": p.y_label,
                "y_range": p.y_range.as_ref().map(|r| [r.start, r.end]),
                "query": p.query,
            })
        })
        .collect();
    json!({
        "charts": charts,
        "timeline": format!("{SPANS} SELECT stage, iteration, lane, start_s, end_s FROM spans ORDER BY start_s"),
        "overlap": format!("{SPANS} {OVERLAP}"),
    })
}

/// Each query's series, or the error that query gave: one bad edit spoils one chart.
async fn charted(store: &RunStore, queries: &[String]) -> Result<Value, Refusal> {
    let sql = RunSql::open(store).await.map_err(Refusal::internal)?;
    let mut out = Vec::new();
    for query in queries {
        out.push(match sql.query(query).await {
            Ok((schema, batches)) if ["x", "series", "y"].iter().all(|c| schema.field_with_name(c).is_ok()) => {
                let series: Vec<Value> =
                    series(&batches).into_iter().map(|s| json!({"name": s.name, "points": s.points})).collect();
                json!({"series": series})
            }
            Ok(_) => json!({"error": "a chart's query returns the columns x, series and y"}),
            Err(e) => json!({"error": e.to_string()}),
        });
    }
    Ok(Value::Array(out))
}

/// A query's result as column names and rows of JSON values.
async fn table(sql: &RunSql, query: &str) -> Result<Value, Refusal> {
    let (schema, batches) = sql.query(query).await.map_err(|e| Refusal::new(400, e.to_string()))?;
    let columns: Vec<&String> = schema.fields().iter().map(|f| f.name()).collect();
    let mut writer = arrow::json::ArrayWriter::new(Vec::new());
    for batch in &batches {
        writer.write(batch).map_err(Refusal::internal)?;
    }
    writer.finish().map_err(Refusal::internal)?;
    let bytes = writer.into_inner();
    let objects: Vec<serde_json::Map<String, Value>> =
        if bytes.is_empty() { Vec::new() } else { serde_json::from_slice(&bytes).map_err(Refusal::internal)? };
    let rows: Vec<Vec<Value>> = objects
        .into_iter()
        .map(|mut object| columns.iter().map(|c| object.remove(c.as_str()).unwrap_or(Value::Null)).collect())
        .collect();
    Ok(json!({"columns": columns, "rows": rows}))
}

/// run.yaml as the run froze it, and what its commits say of where it came from.
async fn provenance(store: &RunStore) -> Result<Value, Refusal> {
    let yaml = store.run_config().await.map_err(Refusal::internal)?;
    let markers = store.markers().await.map_err(Refusal::internal)?;
    let first = markers.iter().map(|m| m.marker.started_at).min();
    let last = markers.iter().map(|m| m.marker.finished_at).max();
    let mut code_versions: Vec<&str> = markers.iter().map(|m| m.marker.code_version.as_str()).collect();
    code_versions.sort();
    code_versions.dedup();
    let fork = crate::config::of_run(store).await.ok().and_then(|c| c.fork).map(|f| json!(f));
    Ok(json!({
        "url": store.url(),
        "yaml": yaml,
        "first_started_at": first.map(|t| t.to_rfc3339()),
        "last_finished_at": last.map(|t| t.to_rfc3339()),
        "code_versions": code_versions,
        "fork": fork,
    }))
}

async fn read_json<T: serde::de::DeserializeOwned>(body: Incoming) -> Result<T, Refusal> {
    let bytes = Limited::new(body, REQUEST_BYTES)
        .collect()
        .await
        .map_err(|e| Refusal::new(400, format!("cannot read the request body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| Refusal::new(400, format!("the request body: {e}")))
}

fn json_reply(status: u16, body: &impl serde::Serialize) -> Reply {
    let text = serde_json::to_vec(body).expect("a reply serialises");
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::CACHE_CONTROL, "no-store")
        .body(Full::new(Bytes::from(text)))
        .expect("a valid response")
}
