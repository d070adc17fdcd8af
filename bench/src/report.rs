//! `report`: today's tables for BENCHMARKS.md, rendered as Markdown from
//! the JSON of one or more runs (one table per question, each naming the
//! run's date and commit). `scripts/bench.sh report` writes them between
//! the markers in BENCHMARKS.md.

use serde_json::Value;
use std::fmt::Write;

/// The line under a table: which run it is from.
fn provenance(run: &Value, file: &str) -> String {
    let date = run["started_unix_s"].as_u64().map_or_else(
        || "unknown date".to_owned(),
        |s| format!("{} UTC", &fencegate_page::utc(s * 1000)[..16]),
    );
    let commit = run["commit"].as_str().unwrap_or("unknown commit");
    format!(
        "_Measured {date} at `{commit}` ({}); the JSON: [`{file}`]({file})._\n",
        run["mode"].as_str().unwrap_or("?")
    )
}

fn f(v: &Value, digits: usize) -> String {
    v.as_f64()
        .map_or_else(|| "–".to_owned(), |x| format!("{x:.digits$}"))
}

fn kind<'a>(level: &'a Value, k: &str) -> Option<&'a Value> {
    level["variants"]
        .as_array()?
        .iter()
        .find(|v| v["kind"] == k)
}

fn small(out: &mut String, run: &Value, file: &str) -> Option<()> {
    let s = &run["results"]["small"];
    let levels = s["levels"].as_array()?;
    let _ = writeln!(
        out,
        "### What does a small PUT cost through the proxy, next to nginx?\n\n\
         {} B PUTs on s3s-fs, {} rounds of {} s per variant, rotated. CPU is each variant's own \
         server process (the store not included); ratio is ops/s over direct's in the same rounds.\n",
        s["object_bytes"], s["rounds"], s["round_secs"]
    );
    // Variants beyond direct, nginx and fencegate, each with a ratio and a
    // CPU column: a second binary (`--baseline`), the hyper floor.
    let extras: Vec<(&str, &str)> = s["variants"]
        .as_array()?
        .iter()
        .filter(|v| v["kind"] == "baseline" || v["kind"] == "floor")
        .filter_map(|v| Some((v["kind"].as_str()?, v["label"].as_str()?)))
        .collect();
    let heads: String = extras.iter().map(|(_, l)| format!(" {l} |")).collect();
    let rules = "---:|".repeat(extras.len());
    let _ = write!(
        out,
        "| c | direct ops/s | ratio: nginx | fencegate |{heads} p50 ms over direct: nginx | fencegate | CPU µs/PUT: nginx | fencegate |{heads} fencegate ÷ nginx CPU |\n|---:|---:|---:|---:|{rules}---:|---:|---:|---:|{rules}---:|\n",
    );
    for l in levels {
        let (d, n, p) = (kind(l, "direct")?, kind(l, "nginx"), kind(l, "fencegate")?);
        let cell = |v: Option<&Value>, field: &str, digits| {
            v.map_or("–".to_owned(), |v| f(&v[field], digits))
        };
        let extra = |field: &str, digits| -> String {
            extras
                .iter()
                .map(|(k, _)| format!(" {} |", cell(kind(l, k), field, digits)))
                .collect()
        };
        let cpu_ratio = n
            .and_then(|n| {
                Some(p["server_cpu_us_per_put"].as_f64()? / n["server_cpu_us_per_put"].as_f64()?)
            })
            .map_or("–".to_owned(), |x| format!("**{x:.2}×**"));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |{} {} | {} | {} | {} |{} {} |",
            l["concurrency"],
            f(&d["series"]["median_ops_per_sec"], 0),
            cell(n, "ratio_ops", 3),
            f(&p["ratio_ops"], 3),
            extra("ratio_ops", 3),
            cell(n, "p50_overhead_ms", 3),
            f(&p["p50_overhead_ms"], 3),
            cell(n, "server_cpu_us_per_put", 0),
            f(&p["server_cpu_us_per_put"], 0),
            extra("server_cpu_us_per_put", 0),
            cpu_ratio
        );
    }
    out.push('\n');
    out.push_str(&provenance(run, file));
    out.push('\n');
    Some(())
}

fn large(out: &mut String, run: &Value, file: &str) -> Option<()> {
    let sizes = run["results"]["large"]["sizes"].as_array()?;
    let baseline = run["results"]["large"]["baseline"].as_str();
    let _ = writeln!(
        out,
        "### Does a large PUT stream at the store's speed?\n\n\
         | object | direct MB/s | proxy MB/s | proxy ÷ direct | nginx ÷ direct |{} proxy peak RSS MiB |\n|---|---:|---:|---:|---:|{}---:|",
        baseline.map_or(String::new(), |b| format!(" {b} ÷ direct |")),
        if baseline.is_some() { "---:|" } else { "" }
    );
    for s in sizes {
        let peak = s["proxy_hwm_after_kib"]
            .as_u64()?
            .max(s["proxy_rss_sampled_peak_kib"].as_u64()?);
        let _ = writeln!(
            out,
            "| {} MiB | {} | {} | {} | {} |{} {:.1} |",
            s["bytes"].as_u64()? >> 20,
            f(&s["direct_median_mb_per_sec"], 1),
            f(&s["proxy_median_mb_per_sec"], 1),
            f(&s["ratio"], 3),
            f(&s["nginx_ratio"], 3),
            if baseline.is_some() {
                format!(" {} |", f(&s["baseline_ratio"], 3))
            } else {
                String::new()
            },
            peak as f64 / 1024.0
        );
    }
    out.push('\n');
    out.push_str(&provenance(run, file));
    out.push('\n');
    Some(())
}

fn scale(out: &mut String, run: &Value, file: &str) -> Option<()> {
    scale_keys(out, run, file);
    scale_scopes(out, run, file)
}

/// The keys part of a scale run, if it ran (`--keys 0` leaves it out).
fn scale_keys(out: &mut String, run: &Value, file: &str) -> Option<()> {
    let k = &run["results"]["scale"]["keys"];
    let windows = k["windows"].as_array()?;
    let _ = writeln!(
        out,
        "### Does one proxy stay flat over a million keys?\n\n\
         {} distinct keys of {} B through one proxy at c = {} (ETag cache: {} entries), in windows; \
         after each, a fifth as many keys straight to the store, to see the store's own slowing.\n\n\
         | keys written | proxy PUTs/s | direct PUTs/s | proxy ÷ direct | proxy p50 ms | proxy CPU µs/PUT | proxy RSS MiB |\n|---:|---:|---:|---:|---:|---:|---:|",
        k["keys"], k["object_bytes"], k["concurrency"], k["etag_cache_entries"]
    );
    let step = (windows.len() / 10).max(1);
    for (i, w) in windows.iter().enumerate() {
        if i % step != 0 && i + 1 != windows.len() {
            continue;
        }
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {:.1} |",
            w["keys"],
            f(&w["proxy_puts_per_sec"], 0),
            f(&w["direct_puts_per_sec"], 0),
            f(&w["ratio_to_direct"], 3),
            f(&w["proxy_latency"]["p50_ms"], 3),
            f(&w["proxy_cpu_us_per_put"], 0),
            w["proxy_rss_kib"].as_f64()? / 1024.0
        );
    }
    let _ = writeln!(
        out,
        "\nLast window over first: proxy **{}**, direct {}, proxy ÷ direct {}. RSS at most **{:.1} MiB**.\n",
        f(&k["end_over_start_proxy"], 3),
        f(&k["end_over_start_direct"], 3),
        f(&k["end_over_start_ratio"], 3),
        k["max_proxy_rss_kib"].as_f64()? / 1024.0
    );
    if let Some(rewrites) = k["rewrites"].as_array() {
        let _ = writeln!(
            out,
            "| rewrite at the end (c = 1) | store requests per PUT | by operation | p50 ms |\n|---|---:|---|---:|"
        );
        for r in rewrites {
            let _ = writeln!(
                out,
                "| {} {} | {} | {} | {} |",
                r["keys"],
                r["what"].as_str().unwrap_or(""),
                f(&r["store_requests_per_put"], 2),
                r["store_ops"],
                f(&r["latency"]["p50_ms"], 3)
            );
        }
    }
    out.push('\n');
    out.push_str(&provenance(run, file));
    out.push('\n');
    Some(())
}

fn scale_scopes(out: &mut String, run: &Value, file: &str) -> Option<()> {
    let s = &run["results"]["scale"]["scopes"];
    let windows = s["windows"].as_array()?;
    let _ = writeln!(
        out,
        "### Do many locks and scopes stay flat?\n\n\
         {} locks of {} scopes each in one proxy's config ({} KiB; the proxy started in {:.0} ms). \
         Each window writes once to every scope of its locks (a raise for each lock's first), \
         then again (admitted against the kept max). {}\n\n\
         | locks written | rewrite p50 ms | rewrites/s | proxy CPU µs/PUT | proxy RSS MiB | status page p50 ms |\n|---:|---:|---:|---:|---:|---:|",
        s["locks"],
        s["scopes_per_lock"],
        s["config_bytes"].as_u64()? / 1024,
        s["start_ms"].as_f64()?,
        match s["etag_cache_entries"].as_u64() {
            Some(n) => format!(
                "The proxy's ETag cache holds {n} keys, so that the keys written (one per scope) \
                 do not grow it: that is the question of the keys above."
            ),
            None => "The proxy's ETag cache was the default (100,000 keys): \
                     its RSS includes the keys written, one per scope."
                .to_owned(),
        }
    );
    for w in windows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.1} | {} |",
            w["locks"],
            f(&w["rewrites_latency"]["p50_ms"], 3),
            f(&w["rewrites_per_sec"], 0),
            f(&w["proxy_cpu_us_per_rewrite"], 0),
            w["proxy_rss_kib"].as_f64()? / 1024.0,
            f(&w["page_ms"]["p50_ms"], 1)
        );
    }
    out.push('\n');
    out.push_str(&provenance(run, file));
    out.push('\n');
    Some(())
}

fn targets(out: &mut String, runs: &[(Value, String)]) {
    let _ = writeln!(
        out,
        "### The targets\n\n| target | measured | | run |\n|---|---|---|---|"
    );
    for (run, file) in runs {
        for t in run["targets"].as_array().into_iter().flatten() {
            let verdict = match t["met"].as_bool() {
                Some(true) => "met",
                Some(false) => "**missed**",
                None => "(context)",
            };
            let _ = writeln!(
                out,
                "| {} | {} | {verdict} | [{}]({file}) |",
                t["target"].as_str().unwrap_or(""),
                t["measured"].as_str().unwrap_or(""),
                run["commit"].as_str().unwrap_or("?")
            );
        }
    }
    out.push('\n');
}

/// The Markdown of `runs` (each a results JSON and its path).
pub fn render(runs: &[(Value, String)]) -> String {
    let mut out = String::new();
    for (run, file) in runs {
        small(&mut out, run, file);
        large(&mut out, run, file);
        scale(&mut out, run, file);
    }
    targets(&mut out, runs);
    out
}
