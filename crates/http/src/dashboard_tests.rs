use actix_web::http::header::{self, HeaderMap};
use actix_web::http::{Method, StatusCode};
use actix_web::test as web_test;
use actix_web::{web, App};

use super::{etag_listed, routes, ASSETS};

macro_rules! app {
    () => {
        web_test::init_service(
            App::new()
                .configure(routes)
                .default_service(web::to(crate::reply::not_found)),
        )
        .await
    };
}

fn hv(h: &HeaderMap, name: header::HeaderName) -> String {
    h.get(&name)
        .unwrap_or_else(|| panic!("no {name}"))
        .to_str()
        .expect("ASCII")
        .to_owned()
}

fn text(a: &super::Asset) -> &'static str {
    std::str::from_utf8(a.body).expect("assets are UTF-8")
}

#[actix_web::test]
async fn every_asset_is_served_with_its_type_a_tag_and_no_cache() {
    let app = app!();
    for a in ASSETS {
        let res =
            web_test::call_service(&app, web_test::TestRequest::get().uri(a.path).to_request())
                .await;
        assert_eq!(res.status(), StatusCode::OK, "{}", a.path);
        let h = res.headers();
        assert_eq!(hv(h, header::CONTENT_TYPE), a.content_type, "{}", a.path);
        assert_eq!(hv(h, header::CACHE_CONTROL), "no-cache", "{}", a.path);
        assert_eq!(
            hv(h, header::X_CONTENT_TYPE_OPTIONS),
            "nosniff",
            "{}",
            a.path
        );
        let tag = hv(h, header::ETAG);
        assert!(tag.starts_with('"') && tag.ends_with('"'), "{tag}");
        assert_eq!(web_test::read_body(res).await, a.body, "{}", a.path);

        // The browser's revalidation: the same tag gets a 304 without the body.
        let req = web_test::TestRequest::get()
            .uri(a.path)
            .insert_header((header::IF_NONE_MATCH, tag.clone()))
            .to_request();
        let res = web_test::call_service(&app, req).await;
        assert_eq!(res.status(), StatusCode::NOT_MODIFIED, "{}", a.path);
        assert_eq!(hv(res.headers(), header::ETAG), tag.as_str());
        assert!(web_test::read_body(res).await.is_empty());

        let req = web_test::TestRequest::get()
            .uri(a.path)
            .insert_header((header::IF_NONE_MATCH, "\"0000000000000000\""))
            .to_request();
        let res = web_test::call_service(&app, req).await;
        assert_eq!(res.status(), StatusCode::OK, "another tag: {}", a.path);

        let req = web_test::TestRequest::default()
            .method(Method::HEAD)
            .uri(a.path)
            .to_request();
        let res = web_test::call_service(&app, req).await;
        assert_eq!(res.status(), StatusCode::OK, "HEAD {}", a.path);
    }
}

#[actix_web::test]
async fn the_page_carries_a_policy_that_allows_only_its_own_origin() {
    let app = app!();
    let res =
        web_test::call_service(&app, web_test::TestRequest::get().uri("/").to_request()).await;
    let csp = hv(res.headers(), header::CONTENT_SECURITY_POLICY);
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(!csp.contains("unsafe"), "{csp}");
}

#[actix_web::test]
async fn unknown_asset_paths_get_the_json_404() {
    let app = app!();
    for path in [
        "/dashboard/",
        "/dashboard/nope.js",
        "/dashboard/app.js/x",
        "/index.html",
    ] {
        let res =
            web_test::call_service(&app, web_test::TestRequest::get().uri(path).to_request()).await;
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{path}");
        assert_eq!(hv(res.headers(), header::CONTENT_TYPE), "application/json");
        let body: serde_json::Value = web_test::read_body_json(res).await;
        assert_eq!(body["code"], 404, "{path}");
    }
    // A write to the page is no endpoint either.
    let res =
        web_test::call_service(&app, web_test::TestRequest::post().uri("/").to_request()).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
}

/// Every file the page names is one the broker serves, and nothing comes from elsewhere:
/// no CDN, no font service, no absolute URL.
#[test]
fn the_page_names_only_served_files() {
    let page = text(&ASSETS[0]);
    assert_eq!(ASSETS[0].path, "/");
    let mut named = 0;
    for attr in ["src=\"", "href=\""] {
        for rest in page.split(attr).skip(1) {
            let url = &rest[..rest.find('"').expect("closing quote")];
            if url.starts_with('#') {
                continue;
            }
            assert!(
                ASSETS.iter().any(|a| a.path == url),
                "index.html names {url}, which is not served"
            );
            named += 1;
        }
    }
    assert!(named >= 4, "index.html names its script, style and icon");
    for a in ASSETS
        .iter()
        .filter(|a| !a.content_type.starts_with("image/"))
    {
        let t = text(a);
        for far in ["http://", "https://", "//cdn", "@import", "url("] {
            assert!(!t.contains(far), "{} contains {far}", a.path);
        }
    }
}

#[test]
fn if_none_match_lists_are_read_as_http_has_them() {
    let tag = "\"00ff\"";
    assert!(etag_listed("\"00ff\"", tag));
    assert!(etag_listed("W/\"00ff\"", tag));
    assert!(etag_listed("\"a\", \"00ff\"", tag));
    assert!(etag_listed("*", tag));
    assert!(!etag_listed("\"00fe\"", tag));
    assert!(!etag_listed("", tag));
}

#[test]
fn tags_differ_when_files_do() {
    let mut tags: Vec<u64> = ASSETS.iter().map(|a| a.etag).collect();
    tags.sort_unstable();
    tags.dedup();
    assert_eq!(tags.len(), ASSETS.len());
    assert_ne!(super::fnv1a(b"a"), super::fnv1a(b"b"));
}
