//! Issue 39.5: keys that S3 holds but `object_store` cannot represent (`ds//x`, `ds/../x`,
//! `ds/a/./b`) are skipped and reported, never fatal to the listing of the prefix above them.
//! Planted byte for byte in a real moto server, as another S3 client could write them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use shardstream_storage::listing;
use shardstream_storage::object_store::path::Path;
use shardstream_storage::testing::MotoServer;

const ODD: [&str; 4] = ["ds//x", "ds/../x", "ds/a/./b", "ds/sub//deep"];

/// Good keys around the odd ones in key order, more than one small page of them.
fn good_keys() -> Vec<String> {
    let mut keys: Vec<String> = (0..24).map(|i| format!("ds/n{i:02}.bin")).collect();
    keys.extend(["ds/-first", "ds/a/b.bin", "ds/sub/c.bin", "ds/zz"].map(String::from));
    keys.sort();
    keys
}

async fn planted() -> MotoServer {
    let moto = MotoServer::start()
        .await
        .unwrap_or_else(|e| panic!("S3 tests need moto_server: {e}"));
    moto.create_bucket("odd").await.unwrap();
    let loc = moto.open("s3://odd").unwrap();
    for key in good_keys() {
        loc.put(&key, Bytes::from(key.clone())).await.unwrap();
    }
    for key in ODD {
        moto.put_raw_key("odd", key, b"odd").await.unwrap();
    }
    moto
}

#[tokio::test]
async fn object_store_alone_fails_the_whole_listing() {
    // What issue 39.5 saw, kept as the reason for `KeySafeStore`: the plain client loses the
    // page. If object_store ever skips such keys itself, this test says the wrapper can go.
    let moto = planted().await;
    let plain = shardstream_storage::object_store::aws::AmazonS3Builder::new()
        .with_endpoint(moto.endpoint())
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_bucket_name("odd")
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .build()
        .unwrap();
    let err = listing::list(&plain, &Path::from("ds")).await.unwrap_err();
    assert!(
        err.to_string().contains("invalid path"),
        "unexpected error: {err}"
    );
}

#[tokio::test]
async fn recursive_listing_skips_and_reports_odd_keys() {
    let moto = planted().await;
    let loc = moto.open("s3://odd/ds").unwrap();

    let keys: Vec<String> = loc
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    let want: Vec<String> = good_keys()
        .iter()
        .map(|k| k.strip_prefix("ds/").unwrap().to_string())
        .collect();
    assert_eq!(keys, want);

    let report = listing::list(&**loc.store(), loc.prefix()).await.unwrap();
    assert_eq!(report.objects.len(), good_keys().len());
    let mut skipped: Vec<&str> = report.skipped.iter().map(|s| s.key.as_str()).collect();
    skipped.sort();
    let mut odd = ODD.to_vec();
    odd.sort();
    assert_eq!(skipped, odd, "every odd key is named, each once");
    assert!(report.skipped.iter().all(|s| !s.reason.is_empty()));

    // A sub-prefix that holds an odd key, and one that holds none.
    let sub: Vec<String> = loc
        .list("sub")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(sub, vec!["sub/c.bin"]);
    assert_eq!(loc.list("a").await.unwrap().len(), 1);
}

#[tokio::test]
async fn listing_by_delimiter_skips_odd_prefixes() {
    let moto = planted().await;
    let loc = moto.open("s3://odd/ds").unwrap();
    // `ds//` and `ds/../` are prefixes no path can name; `ds/a/` is fine (`a/./b` is below).
    assert_eq!(loc.list_dirs("").await.unwrap(), vec!["a", "sub"]);

    let report = listing::list_dirs(&**loc.store(), loc.prefix())
        .await
        .unwrap();
    let mut skipped: Vec<&str> = report.skipped.iter().map(|s| s.key.as_str()).collect();
    skipped.sort();
    assert_eq!(skipped, vec!["ds/../", "ds//"]);
    assert_eq!(report.objects.len(), 26, "the files directly under ds/");
}

#[tokio::test]
async fn reads_and_downloads_of_good_keys_still_work() {
    let moto = planted().await;
    let loc = moto.open("s3://odd/ds").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let report = shardstream_storage::sync_down(&loc, dir.path())
        .await
        .unwrap();
    assert_eq!(report.transferred, good_keys().len());
    assert_eq!(
        std::fs::read(dir.path().join("zz")).unwrap(),
        b"ds/zz".to_vec()
    );
}
