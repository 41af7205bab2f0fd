//! kubectl's and istioctl's verbs that pasactl does not have, each refused with what does the
//! same here, so that what users' fingers type is answered rather than met with a usage dump.

use super::UsageError;

/// The refusal of `verb` (with its arguments `args`): what to run instead.
pub fn refuse(verb: &str, args: &[String]) -> UsageError {
    let rest = args.join(" ");
    let what = match verb {
        "describe" => format!(
            "pasactl has no describe: `pasactl get {rest} -o yaml` shows the object as stored, and `pasactl proxy-status` / `pasactl proxy-config` what proxies were sent"
        ),
        "edit" => format!(
            "pasactl has no edit: `pasactl get {rest} -o yaml > FILE`, change FILE, then `pasactl apply -f FILE`"
        ),
        "create" | "replace" => format!(
            "pasactl {verb}: `pasactl apply -f FILE` creates or updates (add --dry-run=server to check first)"
        ),
        "patch" | "label" | "annotate" => format!(
            "pasactl has no {verb}: `pasactl get KIND NAME -o yaml > FILE`, change FILE, then `pasactl apply -f FILE`"
        ),
        "analyze" => "pasactl analyze: `pasactl validate -f FILE...` checks files offline with Istio's rules and analyzers, and `pasactl apply --dry-run=server -f FILE` against what is stored".to_string(),
        "kube-inject" => "pasactl kube-inject: PCP's injecting webhook moves annotated pods to PASA (see docs/kubernetes.md); there is no offline injection".to_string(),
        "api-resources" => "pasactl api-resources: `pasactl status` lists every kind the store keeps; `pasactl get --help` their short names".to_string(),
        "wait" => format!("pasactl wait: `pasactl x wait {rest}` waits until the proxies serve an object, as istioctl x wait"),
        "simulate" => format!("pasactl simulate: it is `pasactl x simulate {rest}`"),
        "ps" => "pasactl ps: `pasactl proxy-status`".to_string(),
        "create-remote-secret" => format!(
            "pasactl create-remote-secret: it is `pasactl x create-remote-secret {rest}` (istioctl has it under `x` too, in older releases)"
        ),
        _ => format!("unknown command {verb:?}: `pasactl --help` lists the commands"),
    };
    UsageError(what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn habits_are_answered_with_what_does_it() {
        let say = |verb: &str, args: &[&str]| {
            refuse(
                verb,
                &args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            )
            .0
        };
        assert!(
            say("describe", &["vs", "cart", "-n", "shop"])
                .contains("pasactl get vs cart -n shop -o yaml")
        );
        assert!(say("edit", &["dr/cart"]).contains("pasactl apply -f FILE"));
        assert!(say("wait", &["vs", "cart"]).contains("pasactl x wait vs cart"));
        assert!(say("frobnicate", &[]).contains("unknown command \"frobnicate\""));
        assert!(
            say("create-remote-secret", &["--name", "east"])
                .contains("pasactl x create-remote-secret --name east")
        );
    }
}
