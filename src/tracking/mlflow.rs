//! MLflow: one run on a tracking server per petting run, through the server's REST API
//! (`/api/2.0/mlflow`). The MLflow run's id is kept in the store (`_mlflow/run.json`),
//! so a resumed run, or the other lane of an overlapped one, logs into the same run.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::TrackedRun;
use crate::store::RunStore;
use crate::store::layout::MLFLOW_RUN;

/// MLflow's limits on one `log-batch` request and on a parameter.
const PARAMS_PER_BATCH: usize = 100;
const METRICS_PER_BATCH: usize = 1000;
const PARAM_VALUE_CHARS: usize = 6000;
const KEY_CHARS: usize = 250;

/// An MLflow tracking server that receives each stage's metrics and the run's config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MlflowConfig {
    /// The server's URL, e.g. `http://127.0.0.1:5000` (what `mlflow server` prints).
    pub tracking_uri: String,
    /// The experiment that holds the run, made if missing; the run's name when unset.
    #[serde(default)]
    pub experiment: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("MLflow server {uri}: {endpoint}: {message}")]
    Request { uri: String, endpoint: String, message: String },

    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

/// The MLflow run a petting run logs into, as `_mlflow/run.json` keeps it.
#[derive(Debug, Serialize, Deserialize)]
struct StoredRun {
    tracking_uri: String,
    run_id: String,
}

/// A connection to one tracking server.
pub struct Mlflow {
    uri: String,
    http: reqwest::Client,
}

impl Mlflow {
    pub fn new(config: &MlflowConfig) -> Mlflow {
        Mlflow { uri: config.tracking_uri.trim_end_matches('/').to_string(), http: reqwest::Client::new() }
    }

    /// The id of the MLflow run of `store`: the stored one, or a new run named as `run` in
    /// `experiment` (the run's name when unset), tagged with the store's URL and given the
    /// run's settings as parameters. Two lanes that both find none each make one; the one
    /// whose id is stored first wins and the other deletes its own.
    pub async fn run_id(&self, store: &RunStore, experiment: Option<&str>, run: &TrackedRun) -> Result<String, Error> {
        if let Some(run) = self.stored_run(store).await? {
            return Ok(run);
        }
        let experiment_id = self.experiment_id(experiment.unwrap_or(&run.name)).await?;
        let created = self
            .post(
                "runs/create",
                json!({
                    "experiment_id": experiment_id,
                    "run_name": run.name,
                    "start_time": chrono::Utc::now().timestamp_millis(),
                    "tags": [{"key": "petting.store", "value": store.url()}],
                }),
            )
            .await?;
        let run_id = created["run"]["info"]["run_id"].as_str().unwrap_or_default().to_string();
        let params = params(&run.settings);
        for chunk in params.chunks(PARAMS_PER_BATCH) {
            let params: Vec<Value> = chunk.iter().map(|(key, value)| json!({"key": key, "value": value})).collect();
            self.post("runs/log-batch", json!({"run_id": run_id, "params": params})).await?;
        }
        let stored = StoredRun { tracking_uri: self.uri.clone(), run_id: run_id.clone() };
        let bytes = serde_json::to_vec_pretty(&stored).expect("a stored run serialises");
        if store.create_file(MLFLOW_RUN, bytes).await? {
            return Ok(run_id);
        }
        self.post("runs/delete", json!({"run_id": run_id})).await?;
        Ok(self.stored_run(store).await?.unwrap_or(run_id))
    }

    /// The stored run's id, if the store has one for this server.
    async fn stored_run(&self, store: &RunStore) -> Result<Option<String>, Error> {
        let Some(bytes) = store.get_file(MLFLOW_RUN).await? else {
            return Ok(None);
        };
        let run: Option<StoredRun> = serde_json::from_slice(&bytes).ok();
        Ok(run.filter(|r| r.tracking_uri == self.uri).map(|r| r.run_id))
    }

    /// The id of experiment `name`, made if missing.
    async fn experiment_id(&self, name: &str) -> Result<String, Error> {
        if let Ok(id) = self.experiment_by_name(name).await {
            return Ok(id);
        }
        match self.post("experiments/create", json!({"name": name})).await {
            Ok(created) => Ok(created["experiment_id"].as_str().unwrap_or_default().to_string()),
            // Another process made it meanwhile.
            Err(_) => self.experiment_by_name(name).await,
        }
    }

    async fn experiment_by_name(&self, name: &str) -> Result<String, Error> {
        let endpoint = "experiments/get-by-name";
        let mut url = url::Url::parse(&format!("{}/api/2.0/mlflow/{endpoint}", self.uri))
            .map_err(|e| self.error(endpoint, e.to_string()))?;
        url.query_pairs_mut().append_pair("experiment_name", name);
        let found = self.send(endpoint, self.http.get(url)).await?;
        Ok(found["experiment"]["experiment_id"].as_str().unwrap_or_default().to_string())
    }

    /// Logs `metrics` at `step` and `timestamp_ms`; values that are not finite (which
    /// JSON cannot carry) are left out.
    pub async fn log_metrics(
        &self,
        run_id: &str,
        step: i64,
        timestamp_ms: i64,
        metrics: &[(String, f64)],
    ) -> Result<(), Error> {
        let metrics: Vec<Value> = metrics
            .iter()
            .filter(|(_, value)| value.is_finite())
            .map(|(key, value)| json!({"key": key, "value": value, "timestamp": timestamp_ms, "step": step}))
            .collect();
        for chunk in metrics.chunks(METRICS_PER_BATCH) {
            self.post("runs/log-batch", json!({"run_id": run_id, "metrics": chunk})).await?;
        }
        Ok(())
    }

    /// Marks the run finished (its last stage committed).
    pub async fn finish(&self, run_id: &str, end_time_ms: i64) -> Result<(), Error> {
        self.post("runs/update", json!({"run_id": run_id, "status": "FINISHED", "end_time": end_time_ms})).await?;
        Ok(())
    }

    async fn post(&self, endpoint: &str, body: Value) -> Result<Value, Error> {
        let request = self
            .http
            .post(format!("{}/api/2.0/mlflow/{endpoint}", self.uri))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        self.send(endpoint, request).await
    }

    async fn send(&self, endpoint: &str, request: reqwest::RequestBuilder) -> Result<Value, Error> {
        let response = request.send().await.map_err(|e| self.error(endpoint, e.to_string()))?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| self.error(endpoint, e.to_string()))?;
        if !status.is_success() {
            return Err(self.error(endpoint, format!("{status}: {}", String::from_utf8_lossy(&body))));
        }
        serde_json::from_slice(&body).map_err(|e| self.error(endpoint, format!("not JSON: {e}")))
    }

    fn error(&self, endpoint: &str, message: String) -> Error {
        Error::Request { uri: self.uri.clone(), endpoint: endpoint.to_string(), message }
    }
}

/// A run's settings as MLflow parameters, cut to MLflow's limits.
fn params(settings: &BTreeMap<String, String>) -> Vec<(String, String)> {
    settings.iter().map(|(key, value)| (truncate(key, KEY_CHARS), truncate(value, PARAM_VALUE_CHARS))).collect()
}

fn truncate(text: &str, chars: usize) -> String {
    text.chars().take(chars).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_cut_to_mlflows_limits() {
        let settings = BTreeMap::from([("k".repeat(300), "x".repeat(7000))]);
        let params = params(&settings);
        assert_eq!((params[0].0.len(), params[0].1.len()), (KEY_CHARS, PARAM_VALUE_CHARS));
    }
}
