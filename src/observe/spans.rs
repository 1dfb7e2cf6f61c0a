//! OpenTelemetry spans (feature `opentelemetry`) and the `traceparent` a request carries.
//!
//! Following the OpenTelemetry messaging conventions: enqueueing inside an active span
//! records a `create` span (kind PRODUCER) in the app's trace, and the event carries that
//! span's context, so the span is the event's *creation context*; each delivery attempt is a
//! `send {destination}` span (kind PRODUCER), a child of the first event's creation context
//! and linked to every event's, with `messaging.*` attributes, `error.type` on failure and
//! the time the events waited in the outbox. Without an installed tracer provider the
//! `opentelemetry` API records nothing and these cost a thread-local read.
//!
//! Without the feature every type here is empty and every call compiles to nothing, except
//! [`hop_headers`]: the event's own context still travels on the request.

use crate::event::Event;
use crate::outbound::OutboundEvent;
use crate::wire::trace_context::TraceParent;

/// The `messaging.system` of every span.
#[cfg(feature = "opentelemetry")]
const MESSAGING_SYSTEM: &str = "sqlite-outbox";

/// The event whose trace a request continues: the first that carries trace context.
fn leading(events: &[OutboundEvent]) -> Option<(&OutboundEvent, TraceParent<'_>)> {
    events.iter().find_map(|e| {
        let tp = TraceParent::parse(e.traceparent.as_deref()?).ok()?;
        Some((e, tp))
    })
}

/// The `traceparent` (and `tracestate`) headers of a request carrying `events`: the trace of
/// its first event with trace context, with the attempt's `send` span as the parent when
/// spans are recorded (the span is current on this thread while the transport sends), else
/// the event's own context. None when no event has trace context: a request never invents
/// a trace.
pub(crate) fn hop_headers(events: &[OutboundEvent]) -> Option<(String, Option<String>)> {
    let (event, tp) = leading(events)?;
    #[cfg(feature = "opentelemetry")]
    if let Some(headers) = otel::current_span_headers(tp.trace_id()) {
        return Some(headers);
    }
    Some((tp.as_str().to_owned(), event.tracestate.clone()))
}

/// The `create` span of one enqueue, ended by [`finish`](Self::finish).
pub(crate) struct CreateSpan {
    #[cfg(feature = "opentelemetry")]
    span: Option<opentelemetry::global::BoxedSpan>,
}

impl CreateSpan {
    /// When `event` has no trace context of its own and a span is active on this thread,
    /// starts a `create` span as its child and gives the event that span's context.
    /// `destinations` (of the event's type, for the span's name) is called only then.
    #[cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]
    pub(crate) fn capture<'d>(
        event: &mut Event,
        destinations: impl FnOnce(&str) -> Vec<&'d str>,
    ) -> CreateSpan {
        #[cfg(feature = "opentelemetry")]
        if event.traceparent.is_none() {
            return CreateSpan {
                span: otel::start_create(event, destinations),
            };
        }
        CreateSpan {
            #[cfg(feature = "opentelemetry")]
            span: None,
        }
    }

    /// Ends the span with the event's id, or the error that refused it.
    #[cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]
    pub(crate) fn finish(self, outcome: std::result::Result<&str, &crate::Error>) {
        #[cfg(feature = "opentelemetry")]
        if let Some(span) = self.span {
            otel::finish_create(span, outcome);
        }
    }
}

/// The `send` span of one delivery attempt.
pub(crate) struct SendSpan {
    #[cfg(feature = "opentelemetry")]
    context: Option<opentelemetry::Context>,
}

impl SendSpan {
    /// Starts the span of an attempt to deliver `events` to `destination`, at `now_ms`
    /// (unix ms, for the time they waited).
    #[cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]
    pub(crate) fn start(destination: &str, events: &[OutboundEvent], now_ms: i64) -> SendSpan {
        SendSpan {
            #[cfg(feature = "opentelemetry")]
            context: otel::start_send(destination, events, now_ms),
        }
    }

    /// Runs `send` with the span current on this thread, so the transport's request
    /// carries it (see [`hop_headers`]).
    pub(crate) fn in_scope<R>(&self, send: impl FnOnce() -> R) -> R {
        #[cfg(feature = "opentelemetry")]
        let _current = self.context.clone().map(opentelemetry::Context::attach);
        send()
    }

    /// Ends the span: `error_type` names what failed (`None` when delivered), called only
    /// for a span that records.
    #[cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]
    pub(crate) fn end(self, error_type: impl FnOnce() -> Option<String>) {
        #[cfg(feature = "opentelemetry")]
        if let Some(context) = self.context {
            otel::end_send(&context, error_type().as_deref());
        }
    }
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use std::borrow::Cow;

    use opentelemetry::global::{self, BoxedSpan, BoxedTracer};
    use opentelemetry::trace::{
        Span, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
        TraceState, Tracer,
    };
    use opentelemetry::{Context, InstrumentationScope, KeyValue};

    use super::{leading, MESSAGING_SYSTEM};
    use crate::event::Event;
    use crate::outbound::OutboundEvent;
    use crate::wire::trace_context::{check_tracestate, TraceParent};

    fn tracer() -> BoxedTracer {
        global::tracer_with_scope(
            InstrumentationScope::builder("sqlite-outbox")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        )
    }

    /// `00-{trace}-{span}-{flags}` of a span context.
    fn traceparent_of(context: &SpanContext) -> String {
        format!(
            "00-{}-{}-{:02x}",
            context.trace_id(),
            context.span_id(),
            context.trace_flags().to_u8()
        )
    }

    /// The span context an event's stored trace context names (remote: it was written by
    /// another thread, often another process).
    fn creation_context(event: &OutboundEvent) -> Option<SpanContext> {
        let tp = TraceParent::parse(event.traceparent.as_deref()?).ok()?;
        let trace_id = TraceId::from_hex(tp.trace_id()).ok()?;
        let span_id = SpanId::from_hex(tp.parent_id()).ok()?;
        let state = event
            .tracestate
            .as_deref()
            .and_then(|ts| ts.parse::<TraceState>().ok())
            .unwrap_or_default();
        Some(SpanContext::new(
            trace_id,
            span_id,
            TraceFlags::new(tp.flags()),
            true,
            state,
        ))
    }

    pub(super) fn current_span_headers(trace_id: &str) -> Option<(String, Option<String>)> {
        let current = Context::current();
        let span = current.span();
        let context = span.span_context();
        if !context.is_valid() || context.trace_id().to_string() != trace_id {
            return None;
        }
        let state = context.trace_state().header();
        Some((
            traceparent_of(context),
            Some(state).filter(|s| !s.is_empty()),
        ))
    }

    pub(super) fn start_create<'d>(
        event: &mut Event,
        destinations: impl FnOnce(&str) -> Vec<&'d str>,
    ) -> Option<BoxedSpan> {
        let parent = Context::current();
        if !parent.span().span_context().is_valid() {
            return None;
        }
        let destinations = destinations(&event.event_type);
        let name = match destinations.as_slice() {
            [one] => format!("create {one}"),
            _ => "create".to_owned(),
        };
        let mut attributes = vec![
            KeyValue::new("messaging.system", MESSAGING_SYSTEM),
            KeyValue::new("messaging.operation.name", "create"),
            KeyValue::new("messaging.operation.type", "create"),
            KeyValue::new("sqlite_outbox.event.type", event.event_type.clone()),
        ];
        if let [one] = destinations.as_slice() {
            attributes.push(KeyValue::new("messaging.destination.name", one.to_string()));
        }
        let tracer = tracer();
        let span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Producer)
            .with_attributes(attributes)
            .start_with_context(&tracer, &parent);
        let context = span.span_context();
        if context.is_valid() {
            event.traceparent = Some(traceparent_of(context));
            let state = context.trace_state().header();
            event.tracestate = Some(state).filter(|s| !s.is_empty() && check_tracestate(s).is_ok());
        }
        Some(span)
    }

    pub(super) fn finish_create(mut span: BoxedSpan, outcome: Result<&str, &crate::Error>) {
        match outcome {
            Ok(event_id) => {
                span.set_attribute(KeyValue::new("messaging.message.id", event_id.to_owned()))
            }
            Err(e) => {
                span.set_attribute(KeyValue::new("error.type", error_type(e)));
                span.set_status(Status::Error {
                    description: Cow::Owned(format!("{e:#}")),
                });
            }
        }
        span.end();
    }

    /// A low-cardinality name for an enqueue's error: its variant.
    fn error_type(e: &crate::Error) -> String {
        let debug = format!("{e:?}");
        debug
            .split(|c: char| !c.is_ascii_alphanumeric())
            .next()
            .unwrap_or("Error")
            .to_owned()
    }

    pub(super) fn start_send(
        destination: &str,
        events: &[OutboundEvent],
        now_ms: i64,
    ) -> Option<Context> {
        let tracer = tracer();
        let parent = match leading(events).and_then(|(e, _)| creation_context(e)) {
            Some(context) => Context::new().with_remote_span_context(context),
            None => Context::new(),
        };
        // Started bare, so that a span nobody records (no tracer provider installed, or
        // not sampled) costs no attributes or links: the relay's every attempt asks.
        let mut span = tracer
            .span_builder(format!("send {destination}"))
            .with_kind(SpanKind::Producer)
            .start_with_context(&tracer, &parent);
        if !span.is_recording() {
            return None;
        }
        for link in events.iter().filter_map(creation_context) {
            span.add_link(link, Vec::new());
        }
        let oldest = events.iter().map(|e| e.created_at).min().unwrap_or(now_ms);
        let mut attributes = vec![
            KeyValue::new("messaging.system", MESSAGING_SYSTEM),
            KeyValue::new("messaging.operation.name", "send"),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.destination.name", destination.to_owned()),
            KeyValue::new(
                "messaging.message.body.size",
                events.iter().map(|e| e.payload.len() as i64).sum::<i64>(),
            ),
            // How long the oldest event waited in the outbox before this attempt.
            KeyValue::new(
                "sqlite_outbox.wait_ms",
                now_ms.saturating_sub(oldest).max(0),
            ),
        ];
        match events {
            [one] => {
                attributes.push(KeyValue::new("messaging.message.id", one.event_id.clone()));
                attributes.push(KeyValue::new("sqlite_outbox.attempt", one.attempts + 1));
            }
            many => attributes.push(KeyValue::new(
                "messaging.batch.message_count",
                many.len() as i64,
            )),
        }
        span.set_attributes(attributes);
        Some(parent.with_span(span))
    }

    pub(super) fn end_send(context: &Context, error_type: Option<&str>) {
        let span = context.span();
        if let Some(error_type) = error_type {
            span.set_attribute(KeyValue::new("error.type", error_type.to_owned()));
            span.set_status(Status::Error {
                description: Cow::Owned(error_type.to_owned()),
            });
        }
        span.end();
    }
}
