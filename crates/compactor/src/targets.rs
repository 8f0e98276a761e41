//! Offload targets: the second stores blocks are copied to, named by
//! `--offload-target NAME=URL` (the names policies use). A block's copy
//! lives at `{target URL}/{object key}`, the primary's layout, and that
//! full URL is its catalog `location`. A location is read back through the
//! configured target whose URL it starts with (longest first), else through
//! a store built from the location itself with the same options and the
//! environment's credentials (a target since removed from the flags).
//! [`Targets::check`] lists each target's prefix ([`probe`]) for the
//! reachability check the compactor registers in the catalog with the
//! names ([`short_error`] keeps URL secrets out of it).

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::path::Path;
use object_store::prefix::PrefixStore;

use crate::error::Error;

/// One configured target.
#[derive(Clone, Debug)]
pub struct Target {
    pub name: String,
    /// The URL without a trailing slash.
    pub url: String,
    /// Keys are object keys (the URL's path is the prefix).
    pub store: Arc<dyn ObjectStore>,
}

impl Target {
    /// Where `object_key` is copied to in this target.
    pub fn location(&self, object_key: &str) -> String {
        format!("{}/{}", self.url, object_key)
    }
}

/// Longest error of a [`TargetCheck`] (the catalog's limit).
pub const MAX_CHECK_ERROR: usize = 256;

/// Whether one target answered, as registered in the catalog: the name and
/// a short error, never the URL's secrets or credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetCheck {
    pub name: String,
    pub reachable: bool,
    pub checked_at_ns: i64,
    pub error: String,
}

/// A cheap reachability check: lists the target's prefix (one level, no
/// object read); an error or no answer within `timeout` is the reason.
pub async fn probe(store: &dyn ObjectStore, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, store.list_with_delimiter(None)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(short_error(&e.to_string())),
        Err(_) => Err(format!("no answer within {}s", timeout.as_secs_f64())),
    }
}

/// An error fit for the catalog and a Kubernetes condition: URL query
/// strings (signatures, tokens) and userinfo cut out, at most
/// [`MAX_CHECK_ERROR`] bytes.
pub fn short_error(e: &str) -> String {
    let mut out = String::with_capacity(e.len().min(MAX_CHECK_ERROR));
    for (i, word) in e.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let word = word.split_once('?').map_or(word, |(w, _)| w);
        match word
            .split_once("://")
            .and_then(|(scheme, rest)| Some((scheme, rest.split_once('@')?.1)))
        {
            Some((scheme, host)) => {
                out.push_str(scheme);
                out.push_str("://");
                out.push_str(host);
            }
            None => out.push_str(word),
        }
    }
    if out.len() > MAX_CHECK_ERROR {
        let mut end = MAX_CHECK_ERROR - 3;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push_str("...");
    }
    out
}

/// The configured targets.
#[derive(Clone, Debug, Default)]
pub struct Targets {
    list: Vec<Target>,
    options: Vec<(String, String)>,
}

/// Checks one `NAME=URL` spec; returns (name, url without a trailing
/// slash).
pub fn parse_spec(spec: &str) -> Result<(String, String), String> {
    let Some((name, url)) = spec.split_once('=') else {
        return Err(format!("{spec:?} is not NAME=URL"));
    };
    let ok_name = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    if !ok_name {
        return Err(format!(
            "target name {name:?}: 1 to 63 of a-z, 0-9 and '-', not starting with '-'"
        ));
    }
    let url = url.trim_end_matches('/');
    if url.is_empty() {
        return Err(format!("target {name:?} has no URL"));
    }
    Ok((name.to_owned(), url.to_owned()))
}

fn prefixed(store: mira_core::store::Store) -> Arc<dyn ObjectStore> {
    if store.prefix.as_ref().is_empty() {
        store.store
    } else {
        Arc::new(PrefixStore::new(store.store, store.prefix))
    }
}

impl Targets {
    /// Opens every `NAME=URL` target with `options` (object_store keys,
    /// shared by all targets). Names must be distinct.
    pub fn open(specs: &[String], options: &[(String, String)]) -> Result<Targets, Error> {
        let mut list: Vec<Target> = Vec::with_capacity(specs.len());
        for spec in specs {
            let (name, url) = parse_spec(spec).map_err(Error::Internal)?;
            if list.iter().any(|t| t.name == name) {
                return Err(Error::Internal(format!("offload target {name:?} is named twice")));
            }
            let store = mira_core::store::from_url(&url, options).map_err(|e| Error::Internal(e.to_string()))?;
            list.push(Target {
                name,
                url,
                store: prefixed(store),
            });
        }
        Ok(Targets {
            list,
            options: options.to_vec(),
        })
    }

    pub fn get(&self, name: &str) -> Option<&Target> {
        self.list.iter().find(|t| t.name == name)
    }

    pub fn names(&self) -> Vec<String> {
        self.list.iter().map(|t| t.name.clone()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Checks that every target answers (see [`probe`]), at `now_ns`.
    pub async fn check(&self, now_ns: i64, timeout: Duration) -> Vec<TargetCheck> {
        let mut out = Vec::with_capacity(self.list.len());
        for t in &self.list {
            let error = probe(t.store.as_ref(), timeout).await.err();
            out.push(TargetCheck {
                name: t.name.clone(),
                reachable: error.is_none(),
                checked_at_ns: now_ns,
                error: error.unwrap_or_default(),
            });
        }
        out
    }

    /// The store and key holding the copy at `location` of the block whose
    /// object key is `object_key`.
    pub fn resolve(&self, location: &str, object_key: &str) -> Result<(Arc<dyn ObjectStore>, Path), Error> {
        let best = self
            .list
            .iter()
            .filter(|t| location.starts_with(&format!("{}/", t.url)))
            .max_by_key(|t| t.url.len());
        if let Some(t) = best {
            let key = &location[t.url.len() + 1..];
            return Ok((t.store.clone(), Path::from(key)));
        }
        let Some(base) = location.strip_suffix(object_key).map(|b| b.trim_end_matches('/')) else {
            return Err(Error::Internal(format!(
                "offload location {location:?} does not end in its object key {object_key:?}"
            )));
        };
        let store = mira_core::store::from_url(base, &self.options).map_err(|e| Error::Internal(e.to_string()))?;
        Ok((prefixed(store), Path::from(object_key)))
    }
}

#[cfg(test)]
mod tests {
    use object_store::ObjectStoreExt;

    use super::*;

    #[tokio::test]
    async fn a_target_that_answers_is_reachable_and_one_that_does_not_is_not_with_a_short_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Nothing listens on the endpoint's port (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a port")
            .port();
        let options: Vec<(String, String)> = [
            ("aws_endpoint", format!("http://127.0.0.1:{port}")),
            ("aws_allow_http", "true".to_owned()),
            ("aws_access_key_id", "AKIDEXAMPLE".to_owned()),
            ("aws_secret_access_key", "do-not-leak".to_owned()),
            ("aws_region", "us-east-1".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let targets = Targets::open(
            &[
                format!("here=file://{}", dir.path().display()),
                "gone=s3://bucket/prefix".to_owned(),
            ],
            &options,
        )
        .expect("open");
        let checks = targets.check(42, Duration::from_secs(1)).await;
        assert_eq!(checks.len(), 2);
        assert_eq!(
            checks[0],
            TargetCheck {
                name: "here".into(),
                reachable: true,
                checked_at_ns: 42,
                error: String::new(),
            }
        );
        let gone = &checks[1];
        assert_eq!(
            (gone.name.as_str(), gone.reachable, gone.checked_at_ns),
            ("gone", false, 42)
        );
        assert!(!gone.error.is_empty());
        assert!(gone.error.len() <= MAX_CHECK_ERROR, "{}", gone.error);
        assert!(
            !gone.error.contains("do-not-leak") && !gone.error.contains("AKIDEXAMPLE"),
            "{}",
            gone.error
        );
    }

    #[test]
    fn short_errors_lose_query_strings_and_userinfo_and_are_bounded() {
        assert_eq!(
            short_error("GET https://user:pw@host/b?X-Amz-Signature=abc failed: refused"),
            "GET https://host/b failed: refused"
        );
        let long = short_error(&"é".repeat(400));
        assert!(long.len() <= MAX_CHECK_ERROR && long.ends_with("..."), "{long}");
    }

    #[test]
    fn specs_name_their_problem() {
        assert_eq!(
            parse_spec("archive=file:///x/").expect("ok"),
            ("archive".to_owned(), "file:///x".to_owned())
        );
        for bad in ["archive", "=file:///x", "Archive=file:///x", "-a=file:///x", "a="] {
            assert!(parse_spec(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn locations_resolve_to_the_longest_target_or_a_store_of_their_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = format!("file://{}", dir.path().display());
        let targets = Targets::open(&[format!("a={root}/a"), format!("ab={root}/a/b")], &[]).expect("open");
        let key = "t/logs/2026-12-04/10/01J.mira";
        let ab = targets.get("ab").expect("ab");
        ab.store
            .put(&Path::from(key), bytes::Bytes::from_static(b"copy").into())
            .await
            .expect("put");
        let (store, path) = targets.resolve(&ab.location(key), key).expect("resolve");
        assert_eq!(path.as_ref(), key);
        let got = store.get(&path).await.expect("get").bytes().await.expect("bytes");
        assert_eq!(&got[..], b"copy");
        // A location under no configured target: a store of its own.
        let other = Targets::open(&[], &[]).expect("none");
        let (store, path) = other.resolve(&ab.location(key), key).expect("fallback");
        let got = store.get(&path).await.expect("get").bytes().await.expect("bytes");
        assert_eq!(&got[..], b"copy");
        assert!(other.resolve("file:///elsewhere/x.mira", key).is_err());
        assert!(Targets::open(&[format!("a={root}/1"), format!("a={root}/2")], &[]).is_err());
    }
}
