//! The HTTP calls petting makes to a vLLM server (its OpenAI-compatible API plus the
//! LoRA and dev-mode endpoints). Bodies are built and read with serde_json; nothing here
//! knows about policies or stores.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::fingerprint::Fingerprint;
use super::{Error, LogHint};
use crate::model::SamplingConfig;

/// One completion to ask for: prompt token ids in, token ids and logprobs out.
#[derive(Debug, Clone)]
pub struct CompletionRequest<'a> {
    /// The served model: the base's name or an adapter's.
    pub model: &'a str,
    pub prompt_ids: &'a [i64],
    /// As petting's own sampler takes it (temperature 0 is greedy, top_k 0 is none).
    pub sampling: &'a SamplingConfig,
    pub seed: u64,
    pub stop_token_ids: &'a [i64],
}

/// What came back: the sampled ids (the EOS or stop-completing token included) and each
/// one's logprob, under the distribution it was drawn from when the server runs with
/// `--logprobs-mode processed_logprobs` (after the temperature), else at temperature 1.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub token_ids: Vec<i64>,
    pub logprobs: Vec<f32>,
    /// eos, stop or length, as petting's own sampler names them.
    pub finish_reason: String,
}

/// An adapter or base the server lists under /v1/models.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ServedModel {
    pub id: String,
    /// The folder it was loaded from.
    #[serde(default)]
    pub root: Option<String>,
    /// The base an adapter sits on; none for the base itself.
    #[serde(default)]
    pub parent: Option<String>,
}

/// A vLLM server at one URL.
#[derive(Debug, Clone)]
pub struct VllmClient {
    url: String,
    http: reqwest::Client,
    timeout: Duration,
    log: LogHint,
}

impl VllmClient {
    /// `log`: where a server petting started writes its log, named in errors.
    pub fn new(url: &str, timeout: Duration, log: LogHint) -> VllmClient {
        VllmClient { url: url.trim_end_matches('/').to_string(), http: reqwest::Client::new(), timeout, log }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether /health answers 200 now.
    pub async fn healthy(&self) -> bool {
        let request = self.http.get(format!("{}/health", self.url)).timeout(Duration::from_secs(5));
        matches!(request.send().await, Ok(r) if r.status().is_success())
    }

    pub async fn models(&self) -> Result<Vec<ServedModel>, Error> {
        #[derive(Deserialize)]
        struct Listing {
            data: Vec<ServedModel>,
        }
        let body = self.call(reqwest::Method::GET, "/v1/models", None, "listing its models").await?;
        let listing: Listing = parse(&self.url, "listing its models", &body)?;
        Ok(listing.data)
    }

    /// The base model's name: the one model without a parent.
    pub async fn base_model(&self) -> Result<String, Error> {
        let models = self.models().await?;
        models.into_iter().find(|m| m.parent.is_none()).map(|m| m.id).ok_or_else(|| Error::BadResponse {
            url: self.url.clone(),
            during: "listing its models".into(),
            reason: "it lists no base model".into(),
        })
    }

    pub async fn load_adapter(&self, name: &str, path: &str) -> Result<(), Error> {
        let body = json!({"lora_name": name, "lora_path": path});
        self.call(reqwest::Method::POST, "/v1/load_lora_adapter", Some(body), &format!("loading adapter {name}"))
            .await
            .map(drop)
    }

    pub async fn unload_adapter(&self, name: &str) -> Result<(), Error> {
        let body = json!({"lora_name": name});
        self.call(reqwest::Method::POST, "/v1/unload_lora_adapter", Some(body), &format!("unloading adapter {name}"))
            .await
            .map(drop)
    }

    /// Reloads the base weights in place from a folder on the server's disk, then drops
    /// the prefix cache, whose keys and values the old weights computed. Both endpoints
    /// need the server started with VLLM_SERVER_DEV_MODE=1.
    pub async fn reload_weights(&self, path: &str) -> Result<(), Error> {
        let body = json!({"method": "reload_weights", "kwargs": {"weights_path": path}});
        self.call(reqwest::Method::POST, "/collective_rpc", Some(body), &format!("reloading weights from {path}"))
            .await?;
        self.call(reqwest::Method::POST, "/reset_prefix_cache", None, "resetting its prefix cache").await.map(drop)
    }

    /// The fingerprint of the weights the server holds, from petting's worker extension
    /// (`--worker-extension-cls petting_vllm.WeightsFingerprint`, dev mode): one per worker,
    /// which must all agree.
    pub async fn weights_fingerprint(&self) -> Result<Fingerprint, Error> {
        let during = "fingerprinting its weights";
        let body = json!({"method": "petting_weights_fingerprint"});
        let answer = self.call(reqwest::Method::POST, "/collective_rpc", Some(body), during).await?;
        let prints: Vec<Fingerprint> = parse(&self.url, during, &answer["results"])?;
        match prints.split_first() {
            Some((first, rest)) if rest.iter().all(|p| p == first) => Ok(first.clone()),
            _ => Err(Error::BadResponse {
                url: self.url.clone(),
                during: during.into(),
                reason: format!("its workers answered {} fingerprints that are not one", prints.len()),
            }),
        }
    }

    /// The logprob of each token of `ids` after the ones before it (the first has none),
    /// under `model`.
    pub async fn prompt_logprobs(&self, model: &str, ids: &[i64]) -> Result<Vec<f32>, Error> {
        let during = format!("scoring a probe with {model}");
        let body = json!({"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0});
        let answer = self.call(reqwest::Method::POST, "/v1/completions", Some(body), &during).await?;
        let bad =
            |reason: &str| Error::BadResponse { url: self.url.clone(), during: during.clone(), reason: reason.into() };
        let entries = answer["choices"][0]["prompt_logprobs"].as_array().ok_or_else(|| bad("no prompt_logprobs"))?;
        // Each entry maps token ids (as strings) to {logprob, …}; the prompt's own token is among them.
        ids.iter()
            .zip(entries)
            .skip(1)
            .map(|(id, entry)| {
                entry[id.to_string()]["logprob"]
                    .as_f64()
                    .map(|l| l as f32)
                    .ok_or_else(|| bad("a prompt token without its logprob"))
            })
            .collect()
    }

    pub async fn complete(&self, request: &CompletionRequest<'_>) -> Result<Completion, Error> {
        let during = format!("a completion with {}", request.model);
        let answer =
            self.call(reqwest::Method::POST, "/v1/completions", Some(completion_body(request)), &during).await?;
        completion_of(&answer).map_err(|reason| Error::BadResponse { url: self.url.clone(), during, reason })
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        during: &str,
    ) -> Result<Value, Error> {
        let mut request = self.http.request(method, format!("{}{path}", self.url)).timeout(self.timeout);
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body.to_string());
        }
        let unreachable = |e: reqwest::Error| Error::Unreachable {
            url: self.url.clone(),
            during: during.to_string(),
            reason: if e.is_timeout() {
                format!("no answer within {} s", self.timeout.as_secs())
            } else {
                source_chain(&e)
            },
            log: self.log.clone(),
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let text = response.text().await.map_err(unreachable)?;
        if !status.is_success() {
            return Err(Error::Status {
                url: self.url.clone(),
                during: during.to_string(),
                status: status.as_u16(),
                body: text.chars().take(2000).collect(),
                log: self.log.clone(),
            });
        }
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        // Some endpoints answer plain text ("Success: LoRA adapter … added").
        Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }
}

fn parse<T: serde::de::DeserializeOwned>(url: &str, during: &str, body: &Value) -> Result<T, Error> {
    serde_json::from_value(body.clone()).map_err(|e| Error::BadResponse {
        url: url.to_string(),
        during: during.to_string(),
        reason: e.to_string(),
    })
}

/// reqwest's own message hides the cause ("error sending request"): add its sources.
fn source_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// The /v1/completions body: the prompt as token ids, the sampled ids and their logprobs
/// back (vLLM's `return_token_ids`), stop strings kept in the output as petting's sampler
/// keeps them.
pub fn completion_body(r: &CompletionRequest) -> Value {
    let s = r.sampling;
    json!({
        "model": r.model,
        "prompt": r.prompt_ids,
        "max_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": if s.top_k == 0 { -1 } else { i64::from(s.top_k) },
        // vLLM's seeds are signed 64-bit.
        "seed": r.seed & i64::MAX as u64,
        "stop": s.stop,
        "stop_token_ids": r.stop_token_ids,
        "include_stop_str_in_output": true,
        "logprobs": 0,
        "return_token_ids": true,
    })
}

/// Reads one choice of a /v1/completions answer.
pub fn completion_of(answer: &Value) -> Result<Completion, String> {
    let choice = &answer["choices"][0];
    let token_ids: Vec<i64> = serde_json::from_value(choice["token_ids"].clone())
        .map_err(|_| "no token_ids: is the server older than vLLM 0.10.2 (return_token_ids)?".to_string())?;
    let logprobs: Vec<f32> = choice["logprobs"]["token_logprobs"]
        .as_array()
        .ok_or("no token_logprobs")?
        .iter()
        .map(|l| l.as_f64().map(|l| l as f32).ok_or("a token without its logprob"))
        .collect::<Result<_, _>>()?;
    if logprobs.len() != token_ids.len() {
        return Err(format!("{} token ids but {} logprobs", token_ids.len(), logprobs.len()));
    }
    // vLLM says "stop" for EOS, stop ids and stop strings alike; stop_reason tells them apart.
    let finish_reason = match (choice["finish_reason"].as_str(), &choice["stop_reason"]) {
        (Some("length"), _) => "length",
        (Some("stop"), Value::String(_)) => "stop",
        (Some("stop"), _) => "eos",
        (other, _) => return Err(format!("finish_reason {other:?}")),
    };
    Ok(Completion { token_ids, logprobs, finish_reason: finish_reason.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_reads_ids_logprobs_and_why_it_ended() {
        let answer = json!({"choices": [{"token_ids": [5, 2], "logprobs": {"token_logprobs": [-0.5, -0.25]},
            "finish_reason": "stop", "stop_reason": null}]});
        let c = completion_of(&answer).unwrap();
        assert_eq!((c.token_ids, c.logprobs, c.finish_reason.as_str()), (vec![5, 2], vec![-0.5, -0.25], "eos"));
        let stopped = json!({"choices": [{"token_ids": [7], "logprobs": {"token_logprobs": [-1.0]},
            "finish_reason": "stop", "stop_reason": "```"}]});
        assert_eq!(completion_of(&stopped).unwrap().finish_reason, "stop");
        let cut =
            json!({"choices": [{"token_ids": [7], "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "length"}]});
        assert_eq!(completion_of(&cut).unwrap().finish_reason, "length");
        let short = json!({"choices": [{"token_ids": [7, 8], "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "length"}]});
        assert!(completion_of(&short).unwrap_err().contains("2 token ids but 1 logprobs"));
    }

    #[test]
    fn greedy_and_top_k_map_to_vllms_conventions() {
        let sampling = SamplingConfig { max_new_tokens: 8, ..SamplingConfig::greedy() };
        let request = CompletionRequest {
            model: "tool-v1",
            prompt_ids: &[1, 2],
            sampling: &sampling,
            seed: u64::MAX,
            stop_token_ids: &[2],
        };
        let body = completion_body(&request);
        assert_eq!(body["top_k"], -1);
        assert_eq!(body["seed"], json!(i64::MAX as u64));
        assert_eq!(body["prompt"], json!([1, 2]));
    }
}
