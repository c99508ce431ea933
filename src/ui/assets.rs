//! The page's files, compiled into the binary so the dashboard needs no network: its
//! own script and style, and uPlot 1.6.32 (MIT, `assets/ui/vendor/`), the charting library.

use http_body_util::Full;
use hyper::Response;
use hyper::body::Bytes;

/// (name, content type, contents)
const ASSETS: [(&str, &str, &str); 5] = [
    ("index.html", "text/html; charset=utf-8", include_str!("../../assets/ui/index.html")),
    ("dashboard.js", "text/javascript; charset=utf-8", include_str!("../../assets/ui/dashboard.js")),
    ("dashboard.css", "text/css; charset=utf-8", include_str!("../../assets/ui/dashboard.css")),
    ("uPlot.iife.min.js", "text/javascript; charset=utf-8", include_str!("../../assets/ui/vendor/uPlot.iife.min.js")),
    ("uPlot.min.css", "text/css; charset=utf-8", include_str!("../../assets/ui/vendor/uPlot.min.css")),
];

/// The asset named `name`, if there is one.
pub fn reply(name: &str) -> Option<Response<Full<Bytes>>> {
    let (_, content_type, text) = ASSETS.iter().find(|(n, _, _)| *n == name)?;
    let reply = Response::builder()
        .header(hyper::header::CONTENT_TYPE, *content_type)
        .body(Full::new(Bytes::from_static(text.as_bytes())))
        .expect("a valid response");
    Some(reply)
}
