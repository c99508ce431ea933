//! A read-only object store that shows a run's committed files and nothing else.
//!
//! SQL reads a run through this view, so DataFusion's ordinary listing tables (with
//! hive partition pruning) see exactly the files commit markers name: orphans of
//! crashed or losing attempts are not listed and cannot be opened. A committed file
//! that is gone fails every listing that should show it (a query would otherwise
//! silently miss its rows); one whose size no longer matches its marker fails when it
//! is read, so queries whose predicates skip it still answer.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};

use crate::store::{Error, RunStore, StoredMarker};

#[derive(Debug, Clone)]
pub struct CommittedView {
    inner: Arc<dyn ObjectStore>,
    root: Path,
    url: String,
    /// Committed files, relative to the run, with their committed sizes.
    sizes: Arc<HashMap<String, u64>>,
}

impl CommittedView {
    pub fn new(store: &RunStore, markers: &[StoredMarker]) -> CommittedView {
        let sizes = Arc::new(markers.iter().flat_map(|m| &m.marker.files).map(|f| (f.path.clone(), f.bytes)).collect());
        CommittedView {
            inner: Arc::clone(store.object_store()),
            root: store.root().clone(),
            url: store.url().to_string(),
            sizes,
        }
    }

    fn inner_path(&self, location: &Path) -> Path {
        if self.root.as_ref().is_empty() {
            location.clone()
        } else if location.as_ref().is_empty() {
            self.root.clone()
        } else {
            Path::from(format!("{}/{location}", self.root))
        }
    }

    fn view_path(&self, inner: &Path) -> Path {
        match inner.prefix_match(&self.root) {
            Some(parts) => Path::from_iter(parts),
            None => inner.clone(),
        }
    }

    /// The object as the view shows it, if it was committed.
    fn shown(&self, meta: ObjectMeta) -> Option<ObjectMeta> {
        let location = self.view_path(&meta.location);
        self.sizes.contains_key(location.as_ref()).then_some(ObjectMeta { location, ..meta })
    }

    /// The object being read, or an error if it is not what was committed.
    fn checked(&self, meta: ObjectMeta) -> object_store::Result<ObjectMeta> {
        let meta = self.shown(meta).expect("only committed objects are read");
        let expected = self.sizes[meta.location.as_ref()];
        if meta.size != expected {
            let corrupt = Error::Corrupt {
                url: self.url.clone(),
                path: meta.location.to_string(),
                expected: format!("{expected} bytes"),
                actual: format!("{} bytes", meta.size),
            };
            return Err(generic(corrupt));
        }
        Ok(meta)
    }

    /// Committed files under `prefix` that a listing did not return.
    fn missing_under<'a>(&'a self, prefix: &'a str, seen: &'a [ObjectMeta]) -> impl Iterator<Item = &'a String> + 'a {
        self.sizes.keys().filter(move |path| {
            (prefix.is_empty() || path.starts_with(&format!("{prefix}/")))
                && !seen.iter().any(|m| m.location.as_ref() == path.as_str())
        })
    }

    fn missing(&self, path: &str) -> object_store::Error {
        generic(Error::MissingFile { url: self.url.clone(), path: path.to_string() })
    }
}

fn generic(error: Error) -> object_store::Error {
    object_store::Error::Generic { store: "petting run", source: Box::new(error) }
}

fn read_only() -> object_store::Error {
    object_store::Error::NotSupported { source: "a run's committed view is read-only".into() }
}

impl fmt::Display for CommittedView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "committed files of {}", self.url)
    }
}

#[async_trait]
impl ObjectStore for CommittedView {
    async fn put_opts(&self, _: &Path, _: PutPayload, _: PutOptions) -> object_store::Result<PutResult> {
        Err(read_only())
    }

    async fn put_multipart_opts(
        &self,
        _: &Path,
        _: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(read_only())
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        if !self.sizes.contains_key(location.as_ref()) {
            return Err(object_store::Error::NotFound { path: location.to_string(), source: "not committed".into() });
        }
        let result = match self.inner.get_opts(&self.inner_path(location), options).await {
            Err(object_store::Error::NotFound { .. }) => return Err(self.missing(location.as_ref())),
            other => other?,
        };
        let meta = self.checked(result.meta.clone())?;
        Ok(GetResult { meta, ..result })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        locations.map(|_| Err(read_only())).boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let prefix = prefix.cloned().unwrap_or_default();
        let inner_prefix = self.inner_path(&prefix);
        let view = self.clone();
        futures::stream::once(async move {
            let listed: Vec<ObjectMeta> = view.inner.list(Some(&inner_prefix)).try_collect().await?;
            let shown: Vec<ObjectMeta> = listed.into_iter().filter_map(|m| view.shown(m)).collect();
            if let Some(path) = view.missing_under(prefix.as_ref(), &shown).next() {
                return Err(view.missing(path));
            }
            Ok(futures::stream::iter(shown.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let prefix = prefix.cloned().unwrap_or_default();
        let listed = self.inner.list_with_delimiter(Some(&self.inner_path(&prefix))).await?;
        let objects: Vec<ObjectMeta> = listed.objects.into_iter().filter_map(|m| self.shown(m)).collect();
        let direct_child = |path: &&String| path.rsplit_once('/').map_or("", |(dir, _)| dir) == prefix.as_ref();
        if let Some(path) = self.missing_under(prefix.as_ref(), &objects).find(direct_child) {
            return Err(self.missing(path));
        }
        // Only folders that hold a committed file, so orphan-only partitions do not show.
        let common_prefixes = listed
            .common_prefixes
            .iter()
            .map(|p| self.view_path(p))
            .filter(|p| self.sizes.keys().any(|f| f.starts_with(&format!("{p}/"))))
            .collect();
        Ok(ListResult { common_prefixes, objects })
    }

    async fn copy_opts(&self, _: &Path, _: &Path, _: CopyOptions) -> object_store::Result<()> {
        Err(read_only())
    }
}
