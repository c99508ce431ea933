//! Turns a run URL into an object store and the run's root inside it.

use std::path::{Component, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};
use url::Url;

use crate::store::error::{Error, Result};

pub struct Location {
    pub store: Arc<dyn ObjectStore>,
    pub root: Path,
    /// The URL in canonical form (local paths become absolute `file://` URLs).
    pub url: String,
}

/// Resolves a run URL. Cloud credentials, region and endpoint come from the usual
/// environment variables (`AWS_ACCESS_KEY_ID`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
/// `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, …).
pub fn resolve(url: &str) -> Result<Location> {
    let unsupported = |reason: &str| Error::UnsupportedUrl { url: url.to_string(), reason: reason.to_string() };
    if url.trim().is_empty() {
        return Err(unsupported("the URL is empty"));
    }
    let parsed = match Url::parse(url) {
        Ok(parsed) => parsed,
        // No scheme: a local path, relative to the working directory.
        Err(url::ParseError::RelativeUrlWithoutBase) => return local(std::path::Path::new(url), url),
        Err(e) => return Err(unsupported(&e.to_string())),
    };
    match parsed.scheme() {
        "file" => {
            let path = parsed.to_file_path().map_err(|()| unsupported("a file:// URL needs an absolute path"))?;
            local(&path, url)
        }
        "memory" => Ok(Location {
            store: Arc::new(InMemory::new()),
            root: Path::from(format!("{}{}", parsed.host_str().unwrap_or(""), parsed.path())),
            url: url.to_string(),
        }),
        "s3" | "s3a" => {
            require_credentials(url, AWS_CREDENTIALS, "AWS_EC2_METADATA_DISABLED=false")?;
            cloud(url, &parsed, s3(&parsed).map_err(|source| configure(url, source))?)
        }
        "gs" => {
            require_credentials(url, GOOGLE_CREDENTIALS, "PETTING_GCE_METADATA=1")?;
            let store = GoogleCloudStorageBuilder::from_env()
                .with_url(parsed.as_str())
                .with_retry(retry())
                .build()
                .map_err(|source| configure(url, source))?;
            cloud(url, &parsed, Arc::new(store))
        }
        "az" | "abfs" | "abfss" | "azure" => {
            require_credentials(url, AZURE_CREDENTIALS, "PETTING_AZURE_METADATA=1")?;
            let store = MicrosoftAzureBuilder::from_env()
                .with_url(parsed.as_str())
                .with_retry(retry())
                .build()
                .map_err(|source| configure(url, source))?;
            cloud(url, &parsed, Arc::new(store))
        }
        other => Err(unsupported(&format!("the scheme {other}:// is not supported"))),
    }
}

/// Variables that configure credentials for each cloud without asking a metadata server.
const AWS_CREDENTIALS: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_SKIP_SIGNATURE",
];
const GOOGLE_CREDENTIALS: &[&str] = &[
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
];
const AZURE_CREDENTIALS: &[&str] = &[
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_TOKEN",
    "AZURE_CLIENT_SECRET",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_STORAGE_USE_EMULATOR",
];

/// Without configured credentials, the cloud clients fall back to the instance metadata
/// server (169.254.169.254): minutes of time-outs off the cloud, and a request to an
/// address the user never named. That fallback must be asked for.
fn require_credentials(url: &str, variables: &[&str], opt_in: &str) -> Result<()> {
    let (name, value) = opt_in.split_once('=').expect("NAME=value");
    let configured = variables.iter().any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()));
    if configured || std::env::var(name).is_ok_and(|v| v == value) {
        return Ok(());
    }
    Err(Error::NoCredentials {
        url: url.to_string(),
        reason: format!(
            "no credentials are configured; set {} (or {opt_in} to use the instance metadata server)",
            variables.join(" or ")
        ),
    })
}

fn configure(url: &str, source: object_store::Error) -> Error {
    Error::Configure { url: url.to_string(), source: Box::new(source) }
}

/// `path` made absolute against the working directory, with `.` and `..` resolved
/// lexically (object_store refuses `..`, and `pipelines/../runs/x` is a usual path).
pub fn absolute_path(path: &std::path::Path) -> std::io::Result<PathBuf> {
    let mut normal = PathBuf::new();
    for component in std::path::absolute(path)?.components() {
        match component {
            Component::ParentDir => {
                normal.pop();
            }
            Component::CurDir => {}
            other => normal.push(other),
        }
    }
    Ok(normal)
}

fn local(path: &std::path::Path, url: &str) -> Result<Location> {
    let absolute =
        absolute_path(path).map_err(|e| Error::UnsupportedUrl { url: url.to_string(), reason: e.to_string() })?;
    let root = Path::from_absolute_path(&absolute).map_err(|e| configure(url, e.into()))?;
    let file_url = Url::from_file_path(&absolute)
        .map_err(|()| Error::UnsupportedUrl { url: url.to_string(), reason: "not an absolute path".into() })?;
    Ok(Location {
        // Empty folders left by gc are removed, so a collected run looks like a fresh one.
        store: Arc::new(LocalFileSystem::new().with_automatic_cleanup(true)),
        root,
        url: file_url.to_string().trim_end_matches('/').to_string(),
    })
}

fn cloud(url: &str, parsed: &Url, store: Arc<dyn ObjectStore>) -> Result<Location> {
    let root = Path::from_url_path(parsed.path()).map_err(|e| configure(url, e.into()))?;
    Ok(Location { store, root, url: url.trim_end_matches('/').to_string() })
}

fn s3(parsed: &Url) -> object_store::Result<Arc<dyn ObjectStore>> {
    // S3-compatible servers on a local network (SeaweedFS, MinIO, moto) speak plain HTTP
    // and want path-style requests, which is the builder's default.
    let endpoint = std::env::var("AWS_ENDPOINT_URL").or_else(|_| std::env::var("AWS_ENDPOINT"));
    let plain_http = endpoint.as_deref().is_ok_and(|e| e.starts_with("http://"));
    let client = ClientOptions::new().with_connect_timeout(Duration::from_secs(5)).with_allow_http(plain_http);
    let builder = AmazonS3Builder::from_env().with_url(parsed.as_str()).with_retry(retry()).with_client_options(client);
    Ok(Arc::new(builder.build()?))
}

/// Transient failures (5xx, dropped connections) are retried with exponential backoff;
/// an endpoint that never answers fails within seconds rather than minutes.
fn retry() -> RetryConfig {
    RetryConfig {
        max_retries: 6,
        retry_timeout: Duration::from_secs(60),
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_paths_become_absolute_file_urls() {
        let location = resolve("/tmp/petting-runs/a").unwrap();
        assert_eq!(location.url, "file:///tmp/petting-runs/a");
        assert_eq!(location.root.as_ref(), "tmp/petting-runs/a");
        let same = resolve("file:///tmp/petting-runs/a").unwrap();
        assert_eq!(same.root, location.root);
    }

    #[test]
    fn parent_folders_in_local_paths_are_resolved() {
        let location = resolve("/tmp/petting-runs/pipelines/../runs/./a").unwrap();
        assert_eq!(location.url, "file:///tmp/petting-runs/runs/a");
        let relative = resolve("pipelines/../runs/a").unwrap();
        assert_eq!(relative.url, resolve("runs/a").unwrap().url);
    }

    #[test]
    fn memory_urls_keep_their_name_as_root() {
        assert_eq!(resolve("memory://scratch/run1").unwrap().root.as_ref(), "scratch/run1");
    }

    #[test]
    fn unknown_schemes_are_refused_with_the_alternatives() {
        let Err(err) = resolve("ftp://host/run") else { panic!("ftp accepted") };
        let message = err.to_string();
        assert!(matches!(err, Error::UnsupportedUrl { .. }), "{message}");
        assert!(message.contains("ftp://") && message.contains("s3://bucket/prefix"), "{message}");
    }

    #[test]
    fn cloud_urls_need_credentials_or_an_explicit_metadata_opt_in() {
        let missing =
            require_credentials("s3://b/r", &["PETTING_TEST_SURELY_UNSET"], "PETTING_TEST_ALSO_UNSET=1").unwrap_err();
        let message = missing.to_string();
        assert!(message.contains("no credentials are configured; set PETTING_TEST_SURELY_UNSET"), "{message}");
        assert!(message.contains("PETTING_TEST_ALSO_UNSET=1 to use the instance metadata server"), "{message}");
        assert!(require_credentials("s3://b/r", &["PATH"], "X=1").is_ok());
    }
}
