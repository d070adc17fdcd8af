//! The structure the house keeps, checked on the source itself (parsed
//! with `syn`, nothing run). Test code (`#[cfg(test)]`, `tests/`) is left
//! out: these are rules for the product.
//!
//! - **No circles.** In every crate the modules import each other without
//!   a circle: neither between the crate's top-level modules (a folder
//!   counts as one) nor between the files of one folder.
//! - **One fence rule.** A token is compared with a max, a floor or
//!   another token only in `fencegate-core` (`fence::decide` and the
//!   questions beside it): no `<`, `<=`, `>`, `>=` outside `core/` has an
//!   operand that names a token or a max.
//! - **Witnesses are made by their makers.** A value that proves a check
//!   was made has no field another module can set.
//! - **Narrow modules.** No module has more than [`MAX_PUB_ITEMS`] items
//!   other crates can reach (`pub` items and `pub` methods).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Every crate of the product and its source folder.
const CRATES: &[(&str, &str)] = &[
    ("fencegate", "src"),
    ("fencegate-core", "core/src"),
    ("fencegate-durable", "durable/src"),
    ("fencegate-net", "net/src"),
    ("fencegate-page", "page/src"),
    ("fencegate-etcd", "etcd/src"),
    ("fencegate-lease-api", "lease-api/src"),
    ("fencegate-locksvc", "locksvc/src"),
    ("fencegate-proxy", "proxy/src"),
];

/// The witnesses: each proves a check was made, so only its module makes it.
const WITNESSES: &[(&str, &str)] = &[
    ("proxy/src/tokens.rs", "VerifiedToken"),
    ("proxy/src/tokens/upload.rs", "UploadBinding"),
    ("proxy/src/issuer.rs", "Issued"),
    ("proxy/src/fences.rs", "Admission"),
    ("proxy/src/request.rs", "AsIs"),
    ("proxy/src/gate/scope.rs", "Scoped"),
    ("proxy/src/gate/token.rs", "Tokened"),
    ("proxy/src/gate/admission.rs", "Admitted"),
    ("proxy/src/gate/write.rs", "Write"),
    ("locksvc/src/proof.rs", "HeldToken"),
    // Not a witness but the door to the store: its SDK client, reads and
    // lean sender are reached only by the methods that say what for.
    ("proxy/src/backend.rs", "Backend"),
];

/// The most `pub` items one module may have.
const MAX_PUB_ITEMS: usize = 40;

/// Names that mean a token or a bound on tokens when an operand carries them.
fn names_a_token(ident: &str) -> bool {
    let ident = ident.to_ascii_lowercase();
    ident.contains("token")
        || matches!(
            ident.as_str(),
            "max" | "floor" | "cut_by" | "cluster_max" | "by"
        )
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One source file of a crate and the module path it is.
struct Source {
    path: PathBuf,
    module: Vec<String>,
    file: syn::File,
}

fn sources(dir: &str) -> Vec<Source> {
    let base = root().join(dir);
    let mut files = Vec::new();
    walk(&base, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let rel = path.strip_prefix(&base).expect("below its crate");
            let mut module: Vec<String> = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            let text = std::fs::read_to_string(&path).expect("readable source");
            let file = syn::parse_file(&text)
                .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
            Source { path, module, file }
        })
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("structure") {
        let path = entry.expect("structure").path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && {
            let text = meta_text(&a.meta);
            text.contains("test") && !text.contains("not")
        }
    })
}

fn meta_text(meta: &syn::Meta) -> String {
    match meta {
        syn::Meta::List(l) => l.tokens.to_string(),
        syn::Meta::Path(p) => path_text(p),
        syn::Meta::NameValue(_) => String::new(),
    }
}

fn path_text(p: &syn::Path) -> String {
    p.segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

/// The module paths a file refers to (`crate::`, `super::`, `self::` and
/// its child modules), with the line of each.
#[derive(Default)]
struct Refs {
    paths: Vec<Vec<String>>,
}

impl<'a> Visit<'a> for Refs {
    fn visit_item(&mut self, item: &'a syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !is_test_only(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        let mut prefix = Vec::new();
        flatten(&u.tree, &mut prefix, &mut self.paths);
    }

    fn visit_path(&mut self, p: &'a syn::Path) {
        if p.segments.len() > 1 {
            self.paths
                .push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, p);
    }
}

fn flatten(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            if n.ident != "self" {
                path.push(n.ident.to_string());
            }
            out.push(path);
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            path.push(r.ident.to_string());
            out.push(path);
        }
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten(t, prefix, out);
            }
        }
    }
}

/// The module a path names, if it names one of the crate's files.
fn resolve(
    from: &[String],
    path: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let mut at: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("self") => from.to_vec(),
        Some("super") => from[..from.len().saturating_sub(1)].to_vec(),
        Some(first) => {
            let mut child = from.to_vec();
            child.push(first.to_owned());
            if !modules.contains(&child) {
                return None;
            }
            from.to_vec()
        }
        None => return None,
    };
    let mut rest = &path[usize::from(matches!(path[0].as_str(), "crate" | "self" | "super"))..];
    while let Some(("super", tail)) = rest.split_first().map(|(h, t)| (h.as_str(), t)) {
        at.pop();
        rest = tail;
    }
    let mut found = at.clone();
    for seg in rest {
        at.push(seg.clone());
        if modules.contains(&at) {
            found = at.clone();
        } else {
            break;
        }
    }
    modules.contains(&found).then_some(found)
}

/// The circles of a directed graph, each as its members.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's strongly connected components.
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        if let Some(next) = t.edges.get(v) {
            for w in next {
                if !t.index.contains_key(w.as_str()) {
                    visit(t, w);
                    let lw = t.low[w.as_str()];
                    let lv = t.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if t.on.contains(w.as_str()) {
                    let iw = t.index[w.as_str()];
                    let lv = t.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn name(module: &[String]) -> String {
    if module.is_empty() {
        "(root)".to_owned()
    } else {
        module.join("::")
    }
}

#[test]
fn no_module_imports_in_a_circle() {
    let mut found = Vec::new();
    for (krate, dir) in CRATES {
        let sources = sources(dir);
        let modules: BTreeSet<Vec<String>> = sources.iter().map(|s| s.module.clone()).collect();
        // Between top-level modules (a folder is one), and between the
        // files of each folder.
        let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut within: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for s in &sources {
            let mut refs = Refs::default();
            refs.visit_file(&s.file);
            for path in &refs.paths {
                let Some(to) = resolve(&s.module, path, &modules) else {
                    continue;
                };
                if to == s.module {
                    continue;
                }
                let (a, b) = (
                    name(&s.module[..s.module.len().min(1)]),
                    name(&to[..to.len().min(1)]),
                );
                top.entry(a.clone()).or_default();
                if a != b {
                    top.entry(a).or_default().insert(b);
                } else if s.module.len() > 1 || to.len() > 1 {
                    // Both in one folder: the files of that folder.
                    let folder = s.module[..1].to_vec();
                    within
                        .entry(folder)
                        .or_default()
                        .entry(name(&s.module))
                        .or_default()
                        .insert(name(&to));
                }
            }
        }
        for c in circles(&top) {
            found.push(format!("{krate}: {}", c.join(" -> ")));
        }
        for (folder, edges) in &within {
            for c in circles(edges) {
                found.push(format!("{krate} {}/: {}", name(folder), c.join(" -> ")));
            }
        }
    }
    assert!(
        found.is_empty(),
        "modules that import each other in a circle (move the shared part to a leaf both import):\n{}",
        found.join("\n")
    );
}

/// Every identifier of an expression but method names that do not name a
/// token (`a.max(b)` is arithmetic, `held.token()` is a token).
#[derive(Default)]
struct Idents(Vec<String>);

impl<'a> Visit<'a> for Idents {
    fn visit_expr_method_call(&mut self, m: &'a syn::ExprMethodCall) {
        if m.method.to_string().contains("token") {
            self.0.push(m.method.to_string());
        }
        syn::visit::visit_expr_method_call(self, m);
    }
    fn visit_expr_path(&mut self, p: &'a syn::ExprPath) {
        if let Some(last) = p.path.segments.last() {
            self.0.push(last.ident.to_string());
        }
    }
    fn visit_member(&mut self, m: &'a syn::Member) {
        if let syn::Member::Named(i) = m {
            self.0.push(i.to_string());
        }
    }
}

struct Comparisons<'s> {
    file: &'s Path,
    found: Vec<String>,
}

impl<'a> Visit<'a> for Comparisons<'_> {
    fn visit_item(&mut self, item: &'a syn::Item) {
        let test_only = match item {
            syn::Item::Mod(m) => is_test_only(&m.attrs),
            syn::Item::Fn(f) => is_test_only(&f.attrs),
            syn::Item::Impl(i) => is_test_only(&i.attrs),
            _ => false,
        };
        if !test_only {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_expr_binary(&mut self, e: &'a syn::ExprBinary) {
        use syn::BinOp::{Ge, Gt, Le, Lt};
        // A comparison with a literal (`floor > 0`: is there a floor) asks
        // whether a bound is set, not how two tokens stand.
        let literal = |e: &syn::Expr| matches!(e, syn::Expr::Lit(_));
        if matches!(e.op, Lt(_) | Le(_) | Gt(_) | Ge(_)) && !literal(&e.left) && !literal(&e.right)
        {
            let mut idents = Idents::default();
            idents.visit_expr(&e.left);
            idents.visit_expr(&e.right);
            if let Some(named) = idents.0.iter().find(|i| names_a_token(i)) {
                self.found.push(format!(
                    "{}:{}: a comparison naming `{named}`",
                    self.file
                        .strip_prefix(root())
                        .unwrap_or(self.file)
                        .display(),
                    syn::spanned::Spanned::span(&e.op).start().line
                ));
            }
        }
        syn::visit::visit_expr_binary(self, e);
    }
}

#[test]
fn tokens_are_compared_only_in_core() {
    let mut found = Vec::new();
    for (_, dir) in CRATES.iter().filter(|(k, _)| *k != "fencegate-core") {
        for s in sources(dir) {
            let mut c = Comparisons {
                file: &s.path,
                found: Vec::new(),
            };
            c.visit_file(&s.file);
            found.extend(c.found);
        }
    }
    assert!(
        found.is_empty(),
        "tokens compared outside fencegate-core (ask fencegate_core::fence: decide, is_stale, raises, reached):\n{}",
        found.join("\n")
    );
    // The check can fail: the rule's own file has comparisons it would flag.
    let core = sources("core/src")
        .into_iter()
        .find(|s| s.path.ends_with("fence.rs"))
        .expect("core/src/fence.rs");
    let mut c = Comparisons {
        file: &core.path,
        found: Vec::new(),
    };
    c.visit_file(&core.file);
    assert!(
        !c.found.is_empty(),
        "the check finds nothing in core's fence rule itself: it is blind"
    );
}

#[test]
fn witnesses_have_no_field_another_module_can_set() {
    let mut found = Vec::new();
    for (file, ty) in WITNESSES {
        let path = root().join(file);
        let text = std::fs::read_to_string(&path).expect("readable source");
        let parsed = syn::parse_file(&text).expect("structure");
        let item = parsed.items.iter().find_map(|i| match i {
            syn::Item::Struct(s) if s.ident == ty => Some(s),
            _ => None,
        });
        let Some(item) = item else {
            found.push(format!("{file}: no struct {ty} (moved? update WITNESSES)"));
            continue;
        };
        for (i, field) in item.fields.iter().enumerate() {
            if !matches!(field.vis, syn::Visibility::Inherited) {
                let which = field
                    .ident
                    .as_ref()
                    .map_or_else(|| i.to_string(), ToString::to_string);
                found.push(format!(
                    "{file}: {ty}.{which} is visible outside its module"
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "witness fields others can set (make them private; read them by a method):\n{}",
        found.join("\n")
    );
}

/// The fields of `item` visible outside its module, by name or position.
fn visible_fields(item: &syn::ItemStruct) -> Vec<String> {
    item.fields
        .iter()
        .enumerate()
        .filter(|(_, f)| !matches!(f.vis, syn::Visibility::Inherited))
        .map(|(i, f)| {
            f.ident
                .as_ref()
                .map_or_else(|| i.to_string(), ToString::to_string)
        })
        .collect()
}

fn is_pub(v: &syn::Visibility) -> bool {
    matches!(v, syn::Visibility::Public(_))
}

fn pub_items(items: &[syn::Item]) -> usize {
    items
        .iter()
        .map(|item| match item {
            syn::Item::Fn(f) if is_pub(&f.vis) && !is_test_only(&f.attrs) => 1,
            syn::Item::Struct(s) if is_pub(&s.vis) => 1,
            syn::Item::Enum(e) if is_pub(&e.vis) => 1,
            syn::Item::Const(c) if is_pub(&c.vis) => 1,
            syn::Item::Static(c) if is_pub(&c.vis) => 1,
            syn::Item::Trait(t) if is_pub(&t.vis) => 1,
            syn::Item::Type(t) if is_pub(&t.vis) => 1,
            syn::Item::Impl(i) if !is_test_only(&i.attrs) && i.trait_.is_none() => i
                .items
                .iter()
                .filter(|m| matches!(m, syn::ImplItem::Fn(f) if is_pub(&f.vis)))
                .count(),
            syn::Item::Mod(m) if !is_test_only(&m.attrs) => {
                m.content.as_ref().map_or(0, |(_, items)| pub_items(items))
            }
            _ => 0,
        })
        .sum()
}

#[test]
fn no_module_has_more_than_the_bound_of_public_items() {
    let mut found = Vec::new();
    for (_, dir) in CRATES {
        for s in sources(dir) {
            let n = pub_items(&s.file.items);
            if n > MAX_PUB_ITEMS {
                found.push(format!(
                    "{}: {n} public items",
                    s.path.strip_prefix(root()).expect("structure").display()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "modules with more than {MAX_PUB_ITEMS} public items (split by concept, or make items private):\n{}",
        found.join("\n")
    );
}

/// The checks see what they look for: each is shown a small case it must
/// catch and one it must pass, so none of them can pass by being blind.
#[test]
fn each_check_catches_its_own_example() {
    // A circle of three, and a chain that is none.
    let graph = |pairs: &[(&str, &str)]| {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            edges
                .entry((*a).to_owned())
                .or_default()
                .insert((*b).to_owned());
            edges.entry((*b).to_owned()).or_default();
        }
        edges
    };
    assert_eq!(
        circles(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])),
        vec![vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]]
    );
    assert!(circles(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());

    // A child naming its parent by `super::` resolves to the parent.
    let modules: BTreeSet<Vec<String>> = [
        vec![],
        vec!["gate".to_owned()],
        vec!["gate".to_owned(), "token".to_owned()],
    ]
    .into_iter()
    .collect();
    let path = |p: &str| p.split("::").map(str::to_owned).collect::<Vec<_>>();
    let from = vec!["gate".to_owned(), "token".to_owned()];
    assert_eq!(
        resolve(&from, &path("super::Gate"), &modules),
        Some(vec!["gate".to_owned()])
    );
    assert_eq!(
        resolve(&from, &path("crate::gate::token::X"), &modules),
        Some(from.clone())
    );
    assert_eq!(resolve(&from, &path("std::sync::Arc"), &modules), None);

    // Token comparisons, and comparisons that only look like them.
    let flagged = |code: &str| {
        let file: syn::File = syn::parse_str(code).expect("example parses");
        let mut c = Comparisons {
            file: Path::new("example.rs"),
            found: Vec::new(),
        };
        c.visit_file(&file);
        c.found.len()
    };
    assert_eq!(flagged("fn f() { if stored.token() > token {} }"), 1);
    assert_eq!(flagged("fn f() { if self.max <= n {} }"), 1);
    assert_eq!(flagged("fn f() { if floor > 0 {} }"), 0);
    assert_eq!(flagged("fn f() { if n.len() >= self.cap.max(1) {} }"), 0);
    assert_eq!(
        flagged("#[cfg(test)] fn f() { assert!(b.token > a.token); }"),
        0
    );

    // A witness field others can set.
    let item: syn::ItemStruct =
        syn::parse_str("struct W { pub n: u64, m: u64, pub(crate) o: u64 }").expect("parses");
    assert_eq!(visible_fields(&item), vec!["n".to_owned(), "o".to_owned()]);

    // Public items, methods of inherent impls included, test code not.
    let file: syn::File = syn::parse_str(
        "pub fn a() {} fn b() {} pub struct S; impl S { pub fn c() {} fn d() {} } \
         #[cfg(test)] mod tests { pub fn e() {} }",
    )
    .expect("parses");
    assert_eq!(pub_items(&file.items), 3);
}

/// The most `pub` methods one type may have, over all its inherent
/// `impl` blocks in its crate (a hub spread over many files is still one
/// hub).
const MAX_PUB_METHODS: usize = 30;

/// The `pub` methods of each type's inherent impls in `items`, by type.
fn pub_methods(items: &[syn::Item], out: &mut BTreeMap<String, usize>) {
    for item in items {
        match item {
            syn::Item::Impl(i) if i.trait_.is_none() && !is_test_only(&i.attrs) => {
                if let syn::Type::Path(t) = &*i.self_ty
                    && let Some(last) = t.path.segments.last()
                {
                    let n = i
                        .items
                        .iter()
                        .filter(|m| matches!(m, syn::ImplItem::Fn(f) if is_pub(&f.vis)))
                        .count();
                    *out.entry(last.ident.to_string()).or_default() += n;
                }
            }
            syn::Item::Mod(m) if !is_test_only(&m.attrs) => {
                if let Some((_, items)) = &m.content {
                    pub_methods(items, out);
                }
            }
            _ => {}
        }
    }
}

#[test]
fn no_type_has_more_than_the_bound_of_public_methods() {
    let mut found = Vec::new();
    for (krate, dir) in CRATES {
        let mut by_type = BTreeMap::new();
        for s in sources(dir) {
            pub_methods(&s.file.items, &mut by_type);
        }
        for (ty, n) in by_type {
            if n > MAX_PUB_METHODS {
                found.push(format!("{krate}: {ty} has {n} public methods"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "types with more than {MAX_PUB_METHODS} public methods (split the type by what its callers need):\n{}",
        found.join("\n")
    );
    // The count sees methods spread over several impl blocks.
    let file: syn::File =
        syn::parse_str("struct T; impl T { pub fn a() {} } impl T { pub fn b() {} fn c() {} }")
            .expect("parses");
    let mut by_type = BTreeMap::new();
    pub_methods(&file.items, &mut by_type);
    assert_eq!(by_type.get("T"), Some(&2));
}
