//! `pasa.store.v1.Event`, written by hand instead of generated: its resource is an
//! `Arc<Resource>`. The store hands one committed object to every watcher the change concerns,
//! and with a generated `Event` each watch stream had to copy it into its own message (at 100k
//! watchers, a hot service's endpoints were copied tens of thousands of times per change). The
//! wire format is the `.proto`'s, field for field; a client decodes into an `Arc` it alone owns,
//! so taking the resource out ([`Arc::unwrap_or_clone`]) copies nothing.

use std::sync::Arc;

use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, int32, int64, message, skip_field, uint64};
use prost::{DecodeError, Message};

use crate::store::v1::{EventType, Resource};

#[derive(Clone, PartialEq, Default, Debug)]
pub struct Event {
    /// An [`EventType`], as the wire carries it.
    pub r#type: i32,
    /// The revision of the change. Snapshot and subscription-change events carry the revision
    /// the stream was at.
    pub revision: u64,
    /// The object after the change; for DELETED, the last state before deletion.
    pub resource: Option<Arc<Resource>>,
    /// When the store committed the change, in nanoseconds since the Unix epoch; 0 in a
    /// snapshot and in the answer to a subscription change.
    pub commit_time_unix_nanos: i64,
}

impl Event {
    /// The event's type; [`EventType::Unspecified`] for a value this build does not know (the
    /// accessor prost generates for an enum field).
    pub fn r#type(&self) -> EventType {
        EventType::try_from(self.r#type).unwrap_or(EventType::Unspecified)
    }
}

impl Message for Event {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if self.r#type != 0 {
            int32::encode(1, &self.r#type, buf);
        }
        if self.revision != 0 {
            uint64::encode(2, &self.revision, buf);
        }
        if let Some(resource) = &self.resource {
            message::encode(3, resource.as_ref(), buf);
        }
        if self.commit_time_unix_nanos != 0 {
            int64::encode(4, &self.commit_time_unix_nanos, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let (field, merged) = match tag {
            1 => ("type", int32::merge(wire_type, &mut self.r#type, buf, ctx)),
            2 => (
                "revision",
                uint64::merge(wire_type, &mut self.revision, buf, ctx),
            ),
            3 => {
                let resource = Arc::make_mut(self.resource.get_or_insert_default());
                ("resource", message::merge(wire_type, resource, buf, ctx))
            }
            4 => (
                "commit_time_unix_nanos",
                int64::merge(wire_type, &mut self.commit_time_unix_nanos, buf, ctx),
            ),
            _ => return skip_field(wire_type, tag, buf, ctx),
        };
        merged.map_err(|mut e| {
            e.push("Event", field);
            e
        })
    }

    fn encoded_len(&self) -> usize {
        (if self.r#type != 0 {
            int32::encoded_len(1, &self.r#type)
        } else {
            0
        }) + (if self.revision != 0 {
            uint64::encoded_len(2, &self.revision)
        } else {
            0
        }) + self
            .resource
            .as_ref()
            .map_or(0, |r| message::encoded_len(3, r.as_ref()))
            + (if self.commit_time_unix_nanos != 0 {
                int64::encoded_len(4, &self.commit_time_unix_nanos)
            } else {
                0
            })
    }

    fn clear(&mut self) {
        *self = Event::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::v1::{EventBatch, IndexKeys};

    /// The `.proto`'s `Event`, as prost would generate it: the hand-written one must read and
    /// write exactly its wire format.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Generated {
        #[prost(enumeration = "EventType", tag = "1")]
        r#type: i32,
        #[prost(uint64, tag = "2")]
        revision: u64,
        #[prost(message, optional, tag = "3")]
        resource: Option<Resource>,
        #[prost(int64, tag = "4")]
        commit_time_unix_nanos: i64,
    }

    fn resource() -> Resource {
        Resource {
            api_version: "networking.istio.io/v1".into(),
            kind: "DestinationRule".into(),
            namespace: "shop".into(),
            name: "reviews".into(),
            labels: [("app".to_string(), "reviews".to_string())].into(),
            spec_json: r#"{"host":"reviews"}"#.into(),
            mod_revision: 7,
            index: Some(IndexKeys {
                hosts: vec!["reviews.shop.svc.cluster.local".into()],
                gateways: vec![],
            }),
            ..Default::default()
        }
    }

    #[test]
    fn reads_and_writes_the_generated_wire_format() {
        let cases = [
            Generated {
                r#type: EventType::Modified as i32,
                revision: 42,
                resource: Some(resource()),
                commit_time_unix_nanos: 1_700_000_000_123_456_789,
            },
            Generated {
                r#type: EventType::Deleted as i32,
                revision: u64::MAX,
                resource: None,
                commit_time_unix_nanos: -1,
            },
            Generated::default(),
        ];
        for generated in cases {
            let ours = Event {
                r#type: generated.r#type,
                revision: generated.revision,
                resource: generated.resource.clone().map(Arc::new),
                commit_time_unix_nanos: generated.commit_time_unix_nanos,
            };
            let bytes = generated.encode_to_vec();
            assert_eq!(ours.encode_to_vec(), bytes);
            assert_eq!(ours.encoded_len(), bytes.len());
            let decoded = Event::decode(bytes.as_slice()).unwrap();
            assert_eq!(decoded.r#type() as i32, generated.r#type);
            assert_eq!(decoded, ours);
        }
    }

    #[test]
    fn a_shared_resource_is_not_copied_into_the_message_and_decodes_unshared() {
        let shared = Arc::new(resource());
        let batch = EventBatch {
            events: (0..3)
                .map(|revision| Event {
                    r#type: EventType::Added as i32,
                    revision,
                    resource: Some(Arc::clone(&shared)),
                    commit_time_unix_nanos: 0,
                })
                .collect(),
        };
        assert_eq!(Arc::strong_count(&shared), 4);
        let decoded = EventBatch::decode(batch.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded, batch);
        for event in decoded.events {
            let resource = event.resource.unwrap();
            assert_eq!(Arc::strong_count(&resource), 1);
            assert_eq!(*resource, *shared);
        }
    }

    #[test]
    fn an_unknown_field_is_skipped_and_a_bad_one_named() {
        let mut bytes = Event {
            revision: 3,
            ..Default::default()
        }
        .encode_to_vec();
        // Field 9, varint 1: from a newer store.
        bytes.extend([9 << 3, 1]);
        assert_eq!(Event::decode(bytes.as_slice()).unwrap().revision, 3);
        // Field 3 (resource) as a varint: not a message.
        let err = Event::decode([3 << 3, 1].as_slice()).unwrap_err();
        assert!(err.to_string().contains("Event.resource"), "{err}");
    }
}
