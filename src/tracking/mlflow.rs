//! MLflow: one run on a tracking server per petting run, through the server's REST API
//! (`/api/2.0/mlflow`). The MLflow run's id is kept in the store (`_mlflow/run.json`),
//! so a resumed run, or the other lane of an overlapped one, logs into the same run.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

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

    /// The id of the MLflow run of `store`: the stored one, or a new run in `experiment`,
    /// tagged with the store's URL and given `params` (the run's config). Two lanes that
    /// both find none each make one; the one whose id is stored first wins and the other
    /// deletes its own.
    pub async fn run_id(
        &self,
        store: &RunStore,
        experiment: &str,
        run_name: &str,
        params: &[(String, String)],
    ) -> Result<String, Error> {
        if let Some(run) = self.stored_run(store).await? {
            return Ok(run);
        }
        let experiment_id = self.experiment_id(experiment).await?;
        let created = self
            .post(
                "runs/create",
                json!({
                    "experiment_id": experiment_id,
                    "run_name": run_name,
                    "start_time": chrono::Utc::now().timestamp_millis(),
                    "tags": [{"key": "petting.store", "value": store.url()}],
                }),
            )
            .await?;
        let run_id = created["run"]["info"]["run_id"].as_str().unwrap_or_default().to_string();
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

    async fn experiment_id(&self, name: &str) -> Result<String, Error> {
        let by_name = |name: &str| {
            let mut url = url::Url::parse(&format!("{}/api/2.0/mlflow/experiments/get-by-name", self.uri))
                .map_err(|e| self.error("experiments/get-by-name", e.to_string()))?;
            url.query_pairs_mut().append_pair("experiment_name", name);
            Ok::<_, Error>(url)
        };
        let found = self.send("experiments/get-by-name", self.http.get(by_name(name)?)).await;
        if let Ok(found) = found {
            return Ok(found["experiment"]["experiment_id"].as_str().unwrap_or_default().to_string());
        }
        match self.post("experiments/create", json!({"name": name})).await {
            Ok(created) => Ok(created["experiment_id"].as_str().unwrap_or_default().to_string()),
            // Another process made it meanwhile.
            Err(_) => {
                let found = self.send("experiments/get-by-name", self.http.get(by_name(name)?)).await?;
                Ok(found["experiment"]["experiment_id"].as_str().unwrap_or_default().to_string())
            }
        }
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

/// A run config as MLflow parameters: one per leaf, named by its key path (`rollout.branches`),
/// lists and values as JSON text, cut to MLflow's limits.
pub fn params(config: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    flatten(config, String::new(), &mut out);
    out.sort();
    out
}

fn flatten(value: &Value, path: String, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(fields) => {
            for (key, field) in fields {
                let path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                flatten(field, path, out);
            }
        }
        Value::Null => {}
        leaf => {
            let text = match leaf {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            out.push((truncate(&path, KEY_CHARS), truncate(&text, PARAM_VALUE_CHARS)));
        }
    }
}

fn truncate(text: &str, chars: usize) -> String {
    text.chars().take(chars).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_becomes_one_parameter_per_leaf_named_by_its_path() {
        let config = json!({
            "seed": 7,
            "rollout": {"branches": 8, "sampling": {"temperature": 0.7}},
            "evaluation": {"modes": ["multi_agent", "single_agent"], "beside": null},
            "store": "runs/x",
        });
        assert_eq!(
            params(&config),
            vec![
                ("evaluation.modes".to_string(), r#"["multi_agent","single_agent"]"#.to_string()),
                ("rollout.branches".to_string(), "8".to_string()),
                ("rollout.sampling.temperature".to_string(), "0.7".to_string()),
                ("seed".to_string(), "7".to_string()),
                ("store".to_string(), "runs/x".to_string()),
            ]
        );
        let long = json!({"k": "x".repeat(7000)});
        assert_eq!(params(&long)[0].1.len(), PARAM_VALUE_CHARS);
    }
}
