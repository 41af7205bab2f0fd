//! A syncer's task: following what its cluster serves (all of it, or its service registry
//! alone), then comparing and writing as events come, once every resource has been listed and
//! the syncer is not held.

use super::*;

/// How often network gateways' DNS names are resolved again.
const GATEWAY_NAMES_PERIOD: std::time::Duration = std::time::Duration::from_secs(30);

pub(super) async fn run<T: Target>(
    client: Client,
    config: SyncConfig,
    target: T,
    metrics: Arc<SyncMetrics>,
    status: watch::Sender<SyncStatus>,
    mut held: watch::Receiver<bool>,
) {
    tracing::info!(cluster = %config.cluster_id, reads = ?config.reads, "Kubernetes syncer starting");
    let everything = config.reads == Reads::Everything;
    let (services, service_events) = follow(
        Api::<Service>::all(client.clone()),
        trim_nothing,
        "services",
        metrics.clone(),
    );
    let (slices, slice_events) = follow(
        Api::<EndpointSlice>::all(client.clone()),
        trim_nothing,
        "endpointslices",
        metrics.clone(),
    );
    let (pods, pod_events) = follow(
        Api::<Pod>::all(client.clone()),
        trim_pod,
        "pods",
        metrics.clone(),
    );
    let (nodes, node_events) = follow(
        Api::<Node>::all(client.clone()),
        trim_node,
        "nodes",
        metrics.clone(),
    );
    let (namespaces, namespace_events) = follow(
        Api::<Namespace>::all(client.clone()),
        trim_nothing,
        "namespaces",
        metrics.clone(),
    );
    let mut events = vec![
        changes(service_events, "services", Change::Service),
        changes(slice_events, "endpointslices", Change::Slice),
        changes(pod_events, "pods", Change::Pod),
        changes(node_events, "nodes", Change::Node),
        changes(namespace_events, "namespaces", Change::Namespace),
    ];
    // Network gateways' DNS names, resolved as istiod resolves them.
    let gateway_names = crate::gateway_names::GatewayNames::default();
    events.push(
        gateway_names
            .changes(GATEWAY_NAMES_PERIOD)
            .map(|()| Change::GatewayNames)
            .boxed(),
    );
    let mut followed: Vec<&'static str> = REGISTRY_RESOURCES.to_vec();
    let mut configs = BTreeMap::new();
    let mut gateway_api_stores = BTreeMap::new();
    let (mut ingresses, mut ingress_classes) = (reflector::store().0, reflector::store().0);
    let (mut secrets, mut config_maps) = (reflector::store().0, reflector::store().0);
    if everything {
        let (store, ingress_events) = follow(
            Api::<Ingress>::all(client.clone()),
            trim_nothing,
            "ingresses",
            metrics.clone(),
        );
        ingresses = store;
        let (store, ingress_class_events) = follow(
            Api::<IngressClass>::all(client.clone()),
            trim_nothing,
            "ingressclasses",
            metrics.clone(),
        );
        ingress_classes = store;
        events.push(changes(ingress_events, "ingresses", Change::Ingress));
        events.push(changes(
            ingress_class_events,
            "ingressclasses",
            Change::IngressClass,
        ));
        followed.extend(["ingresses", "ingressclasses"]);
        let served = discover(&client, &config, &status, &metrics).await;
        for (kind, resource) in served.istio {
            let writer = reflector::store::Writer::new(resource.clone());
            configs.insert(kind, (resource.clone(), writer.as_reader()));
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let stream = follow_into(api, writer, trim_config, kind.plural(), metrics.clone());
            events.push(changes(stream, kind.plural(), move |e| {
                Change::Config(kind, e)
            }));
        }
        for (k, resource) in served.gateway_api {
            let writer = reflector::store::Writer::new(resource.clone());
            gateway_api_stores.insert(k.kind, (resource.clone(), writer.as_reader()));
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let kind = k.kind;
            let stream = follow_into(api, writer, trim_config, k.resource, metrics.clone());
            events.push(changes(stream, k.resource, move |e| {
                Change::GatewayApi(kind, e)
            }));
        }
        followed.extend(configs.keys().map(|k| k.plural()));
        followed.extend(gateway_api_stores.keys().map(|k| gateway_api_resource(k)));
        // Certificates are read for Gateways, Docker configs for Wasm extensions: without
        // either, no Secret is followed.
        let gateways = gateway_api_stores.contains_key("Gateway");
        let extensions = configs.contains_key(&Kind::WasmPlugin)
            || configs.contains_key(&Kind::TrafficExtension);
        if gateways || extensions {
            let (store, secret_events) = follow_selected(
                Api::<Secret>::all(client.clone()),
                watcher::Config::default().fields(gateway_api::cluster::SECRETS_FIELD_SELECTOR),
                gateway_api::cluster::trim_secret,
                "secrets",
                metrics.clone(),
            );
            secrets = store;
            events.push(changes(secret_events, "secrets", Change::Secret));
            followed.push("secrets");
        }
        if gateways {
            let (store, config_map_events) = follow(
                Api::<ConfigMap>::all(client.clone()),
                gateway_api::cluster::trim_config_map,
                "configmaps",
                metrics.clone(),
            );
            config_maps = store;
            events.push(changes(config_map_events, "configmaps", Change::ConfigMap));
            followed.push("configmaps");
        }
    }
    let resources = followed.len();
    status.send_modify(|s| {
        s.waiting = followed.iter().map(|r| shown(r)).collect();
        s.problems.clear();
    });
    metrics.set_waiting(&status.borrow());
    let events = futures::stream::select_all(events);
    let names = if config.remote {
        ClusterNames::remote(&config.cluster_id)
    } else {
        ClusterNames::own(&config.cluster_id)
    };
    let registry_gateways = config
        .mesh_networks
        .as_ref()
        .map(|mesh| {
            convert::network::registry_gateway_services(mesh, &config.ingress.domain_suffix)
        })
        .unwrap_or_default();
    let mut sync = Syncing {
        config,
        names,
        network: String::new(),
        node_port_gateways: BTreeSet::new(),
        target,
        stores: Stores {
            configs,
            services,
            slices,
            pods,
            nodes,
            namespaces,
            ingresses,
            ingress_classes,
            gateway_api: gateway_api_stores,
            secrets,
            config_maps,
            gateway_names,
            registry_gateways,
        },
        refs: References::default(),
        written: BTreeMap::new(),
        dirty: BTreeSet::new(),
        full: true,
        derived: BTreeMap::new(),
        ingresses_changed: true,
        derived_gateway_api: BTreeMap::new(),
        derived_mesh_networks: BTreeMap::new(),
        gateway_names_changed: true,
        gateway_api_changed: true,
        mentioned: gateway_api::cluster::Mentioned::default(),
        unreadable: BTreeSet::new(),
        derived_pull_secrets: BTreeMap::new(),
        pull_secrets_named: BTreeSet::new(),
        pull_secrets_changed: true,
        selected: HashMap::new(),
        retry: BTreeSet::new(),
        backoff: Backoff::new(RETRY_FIRST, RETRY_MAX, Duration::ZERO),
        status,
        metrics,
    };
    let mut listed: BTreeSet<&'static str> = BTreeSet::new();
    let mut batches = std::pin::pin!(events.ready_chunks(1024));
    let mut retry_at: Option<tokio::time::Instant> = None;
    // What the store held of this cluster when the syncer first compared: read then (not at
    // start), so that a syncer released after another of its cluster starts from what that
    // one wrote last.
    let mut owned_read = false;
    loop {
        let retry_due = async move {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            batch = batches.next() => {
                let Some(batch) = batch else { return };
                let handled = batch.len() as u64;
                let waiting = !sync.status.borrow().waiting.is_empty();
                for change in batch {
                    sync.note_health(&change);
                    if let Some(done) = sync.handle(change) {
                        listed.insert(done);
                        sync.status.send_modify(|s| {
                            s.waiting.remove(&shown(done));
                        });
                    }
                }
                sync.status.send_modify(|s| s.events += handled);
                if waiting {
                    sync.metrics.set_waiting(&sync.status.borrow());
                }
            }
            () = retry_due => {
                retry_at = None;
                let retry = std::mem::take(&mut sync.retry);
                sync.dirty.extend(retry);
            }
            changed = held.changed(), if *held.borrow() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        // Nothing is compared until every resource has been listed once: a pass before the
        // pods are in would write endpoints without their labels.
        if listed.len() < resources {
            continue;
        }
        if !sync.status.borrow().listed {
            sync.status.send_modify(|s| s.listed = true);
        }
        if *held.borrow() {
            continue;
        }
        if !owned_read {
            sync.read_owned().await;
            owned_read = true;
        }
        sync.pass().await;
        if sync.retry.is_empty() {
            sync.backoff.reset();
        } else if retry_at.is_none() {
            retry_at = Some(tokio::time::Instant::now() + sync.backoff.failed());
        }
    }
}
