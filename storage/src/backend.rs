//! Building the `object_store` backend for a parsed [`StorageUrl`].

use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::ObjectStore;

use crate::aws_chain::AwsChainProvider;
use crate::env::{AwsCredentials, Env, S3Settings};
use crate::error::{Result, StorageError};
use crate::listing::KeySafeStore;
use crate::options::StorageOptions;
use crate::shaping::{Shaper, ShapingConfig, ShapingConnector};
use crate::url::StorageUrl;

/// A built store and what is known of it.
#[derive(Debug)]
pub(crate) struct Built {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// Whether its create-only put is one atomic step (`Location::create_is_atomic`): a local
    /// directory (object_store hard-links a create into place) and Amazon S3's own endpoint.
    /// An S3-compatible server at a custom endpoint may check and then write (moto's and
    /// s3s-fs's do); GCS and Azure are atomic, but their emulators are set up through many keys
    /// (service account files, emulator flags) and are not told apart here, so not trusted.
    pub(crate) atomic_create: bool,
    /// The limiter every HTTP attempt of a remote store passes through; `None` for a local
    /// directory and when shaping is off.
    pub(crate) shaper: Option<Arc<Shaper>>,
}

/// Builds the store for `url`, configured from `env` and `options`. Remote stores are wrapped
/// in [`KeySafeStore`] so that one odd key cannot fail a whole listing.
pub(crate) fn build(url: &StorageUrl, env: &Env, options: &StorageOptions) -> Result<Built> {
    env.register_secrets();
    // The one place request shaping is inserted: below object_store's retry loop, so that
    // retries are paced too (see `shaping`).
    let shaper = match &options.shaping {
        Some(config) => {
            config.check()?;
            config.shaper()
        }
        None => ShapingConfig::from_env(env)?.shaper(),
    };
    let connector = || shaper.clone().map(ShapingConnector::new);
    let config_error = |e: object_store::Error| StorageError::Config {
        url: url.to_string(),
        reason: e.to_string(),
    };
    match url {
        StorageUrl::S3 { bucket, .. } => {
            let settings = S3Settings::resolve(env, options)?;
            tracing::debug!(
                bucket,
                endpoint = ?settings.endpoint.as_deref().map(crate::redact::redact_url),
                region = %settings.region,
                allow_http = settings.allow_http,
                "opening S3 location"
            );
            let client = options
                .client_options(settings.allow_http)
                .with_no_system_certificates(settings.plain_http_only());
            let mut builder = AmazonS3Builder::new()
                .with_client_options(client)
                .with_retry(options.retry.to_retry_config());
            if let Some(c) = connector() {
                builder = builder.with_http_connector(c);
            }
            if let AwsCredentials::Chain(sources) = &settings.credentials {
                let chain = AwsChainProvider::new((**sources).clone(), &settings.region)?;
                builder = builder.with_credentials(Arc::new(chain));
            }
            let store = settings
                .apply(builder)
                .with_bucket_name(bucket)
                .build()
                .map_err(config_error)?;
            Ok(Built {
                store: Arc::new(KeySafeStore::new(store)),
                atomic_create: settings.endpoint.is_none(),
                shaper,
            })
        }
        StorageUrl::Gcs { bucket, .. } => {
            let mut builder = GoogleCloudStorageBuilder::new()
                .with_client_options(options.client_options(options.allow_http.unwrap_or(false)))
                .with_retry(options.retry.to_retry_config());
            if let Some(c) = connector() {
                builder = builder.with_http_connector(c);
            }
            for (key, value) in env.with_prefix("GOOGLE_") {
                if let Ok(key) = key.to_ascii_lowercase().parse::<GoogleConfigKey>() {
                    builder = builder.with_config(key, value);
                }
            }
            if let Some(sa) = env.get("SERVICE_ACCOUNT") {
                builder = builder.with_service_account_path(sa);
            }
            for (key, value) in &options.config {
                builder = builder.with_config(backend_key(url, key)?, value);
            }
            if let Some(anonymous) = options.anonymous {
                builder = builder.with_skip_signature(anonymous);
            }
            let store = builder
                .with_bucket_name(bucket)
                .build()
                .map_err(config_error)?;
            Ok(Built {
                store: Arc::new(KeySafeStore::new(store)),
                atomic_create: false,
                shaper,
            })
        }
        StorageUrl::Azure { base, .. } => {
            let mut builder = MicrosoftAzureBuilder::new()
                .with_client_options(options.client_options(options.allow_http.unwrap_or(false)))
                .with_retry(options.retry.to_retry_config());
            if let Some(c) = connector() {
                builder = builder.with_http_connector(c);
            }
            for (key, value) in env.with_prefix("AZURE_") {
                if let Ok(key) = key.to_ascii_lowercase().parse::<AzureConfigKey>() {
                    builder = builder.with_config(key, value);
                }
            }
            for (key, value) in &options.config {
                builder = builder.with_config(backend_key(url, key)?, value);
            }
            if let Some(anonymous) = options.anonymous {
                builder = builder.with_skip_signature(anonymous);
            }
            let store = builder.with_url(base).build().map_err(config_error)?;
            Ok(Built {
                store: Arc::new(KeySafeStore::new(store)),
                atomic_create: false,
                shaper,
            })
        }
        StorageUrl::Local { .. } => {
            // Rooted at `/` so the location's directory need not exist yet (writers create
            // it); fsync so that a completed put is durable, as it is on S3.
            Ok(Built {
                store: Arc::new(LocalFileSystem::new().with_fsync(true)),
                atomic_create: true,
                shaper: None,
            })
        }
    }
}

/// A per-call `object_store` key for the URL's backend.
fn backend_key<K: std::str::FromStr>(url: &StorageUrl, key: &str) -> Result<K> {
    key.parse::<K>().map_err(|_| StorageError::Config {
        url: url.to_string(),
        reason: format!("storage option {key:?} does not apply to this location"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_builds_without_network_or_credentials() {
        let url = StorageUrl::S3 {
            bucket: "b".into(),
            prefix: String::new(),
        };
        let env = Env::from_pairs([("AWS_ENDPOINT_URL", "http://127.0.0.1:1")]);
        let store = build(&url, &env, &StorageOptions::default()).unwrap().store;
        assert!(store.to_string().contains("AmazonS3"), "{store}");
    }

    #[test]
    fn remote_http_endpoint_is_refused_at_build_time() {
        let url = StorageUrl::S3 {
            bucket: "b".into(),
            prefix: String::new(),
        };
        let env = Env::from_pairs([("AWS_ENDPOINT_URL", "http://10.1.2.3:9000")]);
        let err = build(&url, &env, &StorageOptions::default()).unwrap_err();
        assert!(matches!(err, StorageError::Config { .. }), "{err}");
    }

    #[test]
    fn azure_account_comes_from_env() {
        let url = StorageUrl::parse_in("az://cont/x", std::path::Path::new("/")).unwrap();
        let env = Env::from_pairs([
            ("AZURE_STORAGE_ACCOUNT_NAME", "acct"),
            ("AZURE_STORAGE_ACCOUNT_KEY", "a2V5"),
        ]);
        let store = build(&url, &env, &StorageOptions::default()).unwrap().store;
        assert!(store.to_string().contains("acct"), "{store}");
    }
}
