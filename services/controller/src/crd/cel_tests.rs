//! The CRD's CEL validation rules (`x-kubernetes-validations`) executed the way the API server
//! does: every rule of the generated schema is compiled with a CEL interpreter and evaluated with
//! `self` bound to the value at the rule's place in an object (rules of absent fields do not
//! run), with the Kubernetes quantity library (`isQuantity`, `quantity`, `sign`, `compareTo`)
//! provided. Good objects pass every rule; each bad one fails with the rule's message.

use std::sync::Arc;

use cel_interpreter::extractors::This;
use cel_interpreter::{Context, Program, Value as Cel};
use serde_json::{json, Value};

use super::AwareAutoscaler;
use kube::CustomResourceExt;

/// A quantity in base units with its sign, or `None` when `s` is not a Kubernetes quantity.
fn quantity_value(s: &str) -> Option<f64> {
    let (sign, body) = match s.strip_prefix('-') {
        Some(rest) => (-1.0, rest),
        None => (1.0, s.strip_prefix('+').unwrap_or(s)),
    };
    let end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return None;
    }
    let n: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e => {
            let exp: i32 = e.strip_prefix(['e', 'E'])?.parse().ok()?;
            10f64.powi(exp)
        }
    };
    Some(sign * n * factor)
}

fn context() -> Context<'static> {
    let mut ctx = Context::default();
    ctx.add_function("isQuantity", |s: Arc<String>| quantity_value(&s).is_some());
    // A quantity is represented by its value in base units; `sign` and `compareTo` are methods.
    ctx.add_function("quantity", |s: Arc<String>| {
        quantity_value(&s).unwrap_or(f64::NAN)
    });
    ctx.add_function("sign", |This(q): This<f64>| -> i64 {
        if q > 0.0 {
            1
        } else if q < 0.0 {
            -1
        } else {
            0
        }
    });
    ctx.add_function("compareTo", |This(a): This<f64>, b: f64| -> i64 {
        if a < b {
            -1
        } else if a > b {
            1
        } else {
            0
        }
    });
    ctx
}

/// Every (path, rule, message) of the schema; a path is the list of property names from the root.
fn rules(schema: &Value, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, String, String)>) {
    if let Some(list) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        for r in list {
            out.push((
                path.clone(),
                r["rule"].as_str().unwrap().to_string(),
                r["message"].as_str().unwrap_or("").to_string(),
            ));
        }
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            path.push(name.clone());
            rules(sub, path, out);
            path.pop();
        }
    }
    if let Some(items) = schema.get("items") {
        path.push("[]".to_string());
        rules(items, path, out);
        path.pop();
    }
}

/// The values at `path` in `obj` (`[]` walks every element of a list).
fn values_at<'a>(obj: &'a Value, path: &[String]) -> Vec<&'a Value> {
    match path.split_first() {
        None => vec![obj],
        Some((head, rest)) if head == "[]" => obj
            .as_array()
            .map(|a| a.iter().flat_map(|v| values_at(v, rest)).collect())
            .unwrap_or_default(),
        Some((head, rest)) => obj
            .get(head)
            .map(|v| values_at(v, rest))
            .unwrap_or_default(),
    }
}

/// The messages of every rule `obj` breaks.
fn violations(obj: &Value) -> Vec<String> {
    let crd = serde_json::to_value(AwareAutoscaler::crd()).unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut all = Vec::new();
    rules(schema, &mut Vec::new(), &mut all);
    assert!(all.len() >= 10, "the schema carries its CEL rules");
    let mut out = Vec::new();
    for (path, rule, message) in &all {
        let program = Program::compile(rule).unwrap_or_else(|e| panic!("`{rule}`: {e:?}"));
        for v in values_at(obj, path) {
            let mut ctx = context();
            ctx.add_variable("self", cel_interpreter::to_value(v).unwrap())
                .unwrap();
            match program.execute(&ctx) {
                Ok(Cel::Bool(true)) => {}
                Ok(Cel::Bool(false)) => out.push(message.clone()),
                other => panic!("rule `{rule}` at {path:?} on {v}: {other:?}"),
            }
        }
    }
    out
}

fn good() -> Value {
    json!({
        "apiVersion": "aware.dev/v1alpha1",
        "kind": "AwareAutoscaler",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "updatePolicy": {"updateMode": "Off"},
            "constraints": {"minReplicas": 2, "maxReplicas": 12},
            "resourcePolicy": {"containerPolicies": [
                {"containerName": "app",
                 "minAllowed": {"cpu": "100m", "memory": "128Mi"},
                 "maxAllowed": {"cpu": "2", "memory": "2Gi"}},
                {"containerName": "*", "maxAllowed": {"memory": "1.5G"}},
            ]},
            "slo": {"latencyP99Ms": 250.0, "throughputRps": 40.0},
            "objective": {"alpha": 0.5},
        },
    })
}

#[test]
fn good_objects_pass_every_rule() {
    assert_eq!(violations(&good()), Vec::<String>::new());
    // The committed example too.
    let example: Value = serde_norway::from_str(include_str!(
        "../../../../deploy/examples/awareautoscaler.yaml"
    ))
    .unwrap();
    assert_eq!(violations(&example), Vec::<String>::new());
}

#[test]
fn bad_objects_fail_with_the_rule_message() {
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "/spec/constraints",
            json!({"minReplicas": 9, "maxReplicas": 3}),
            "constraints.minReplicas must not exceed constraints.maxReplicas",
        ),
        (
            "/spec/scaleTargetRef/kind",
            json!("StatefulSet"),
            "only Deployments are supported",
        ),
        (
            "/spec/scaleTargetRef/name",
            json!(""),
            "scaleTargetRef.name must not be empty",
        ),
        (
            "/spec/resourcePolicy/containerPolicies/0/minAllowed/cpu",
            json!("3"),
            "minAllowed.cpu must not exceed maxAllowed.cpu",
        ),
        (
            "/spec/resourcePolicy/containerPolicies/0/maxAllowed/memory",
            json!("100Mi"),
            "minAllowed.memory must not exceed maxAllowed.memory",
        ),
        (
            "/spec/resourcePolicy/containerPolicies/0/minAllowed/cpu",
            json!("-100m"),
            "cpu must be a positive quantity such as 500m or 1",
        ),
        (
            "/spec/resourcePolicy/containerPolicies/1/maxAllowed/memory",
            json!("lots"),
            "memory must be a positive quantity such as 512Mi or 1Gi",
        ),
        (
            "/spec/resourcePolicy/containerPolicies/1/containerName",
            json!(""),
            "containerName must not be empty",
        ),
        (
            "/spec/slo/latencyP99Ms",
            json!(-5.0),
            "slo.latencyP99Ms must be positive",
        ),
        (
            "/spec/slo/throughputRps",
            json!(0.0),
            "slo.throughputRps must be positive",
        ),
    ];
    for (pointer, value, message) in cases {
        let mut obj = good();
        *obj.pointer_mut(pointer).unwrap() = value.clone();
        let v = violations(&obj);
        assert!(
            v.iter().any(|m| m == message),
            "{pointer} = {value}: expected `{message}`, got {v:?}"
        );
    }
}

#[test]
fn the_quantity_library_stand_in_reads_kubernetes_quantities() {
    assert_eq!(quantity_value("500m"), Some(0.5));
    assert_eq!(quantity_value("2Gi"), Some(2.0 * 1024f64.powi(3)));
    assert_eq!(quantity_value("1.5G"), Some(1.5e9));
    assert_eq!(quantity_value("-1"), Some(-1.0));
    assert_eq!(quantity_value("1e3"), Some(1000.0));
    assert_eq!(quantity_value("lots"), None);
    assert_eq!(quantity_value("1Qi"), None);
}
