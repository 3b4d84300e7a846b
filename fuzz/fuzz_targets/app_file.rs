//! The simulator's app-file loader (`aware_loadgen::app::AppSet`): the first byte picks YAML or
//! JSON (as `AppSet::read` does by extension), the rest is the file.
//!
//! Invariants: a loaded app set passes its own validation, and writing it back (YAML and JSON,
//! as `AppSet::write` does) and reading that gives the same app set.
#![no_main]

use aware_loadgen::app::AppSet;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, text)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let loaded = if selector % 2 == 0 {
        AppSet::from_yaml(text)
    } else {
        AppSet::from_json(text)
    };
    let Ok(set) = loaded else {
        return;
    };
    if let Err(e) = set.validate() {
        panic!("a loaded app set fails its own validation: {e}");
    }
    let yaml = match set.to_yaml() {
        Ok(y) => y,
        Err(e) => panic!("a loaded app set does not serialize to YAML: {e}"),
    };
    match AppSet::from_yaml(&yaml) {
        Ok(again) => assert_eq!(again, set, "YAML round trip differs:\n{yaml}"),
        Err(e) => panic!("an app set written as YAML does not load: {e}\n{yaml}"),
    }
    let json = match set.to_json() {
        Ok(j) => j,
        Err(e) => panic!("a loaded app set does not serialize to JSON: {e}"),
    };
    match AppSet::from_json(&json) {
        Ok(again) => assert_eq!(again, set, "JSON round trip differs:\n{json}"),
        Err(e) => panic!("an app set written as JSON does not load: {e}\n{json}"),
    }
});
