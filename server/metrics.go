package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the server's Prometheus series, on a registry of its own (so
// several servers can live in one process, as in tests).
type metrics struct {
	reg *prometheus.Registry

	running, waiting        prometheus.Gauge
	promptTokens, prefilled prometheus.Counter
	completionTokens        prometheus.Counter
	prefillRate, decodeRate prometheus.Gauge
	ttft, itl               prometheus.Histogram
	kvUsed, kvCapacity      prometheus.Gauge
	prefixHits              prometheus.Counter
	prefixHitTokens         prometheus.Counter
	steps                   prometheus.Counter
	stepRows                prometheus.Histogram
	requests                *prometheus.CounterVec
	rejected                *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	f := func(c prometheus.Collector) { m.reg.MustRegister(c) }
	g := func(name, help string) prometheus.Gauge {
		x := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "cortiq", Name: name, Help: help})
		f(x)
		return x
	}
	c := func(name, help string) prometheus.Counter {
		x := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "cortiq", Name: name, Help: help})
		f(x)
		return x
	}
	m.running = g("requests_running", "Sequences in the running batch.")
	m.waiting = g("requests_waiting", "Requests waiting for a free slot.")
	m.promptTokens = c("prompt_tokens_total", "Prompt tokens of admitted requests (cached ones included).")
	m.prefilled = c("prefill_tokens_total", "Prompt tokens run through the model (cache hits excluded).")
	m.completionTokens = c("generation_tokens_total", "Tokens generated.")
	m.prefillRate = g("prefill_tokens_per_second", "Prompt tokens per second of the last step that prefilled.")
	m.decodeRate = g("decode_tokens_per_second", "Aggregate decode tokens per second of the last step that decoded.")
	lat := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	m.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "cortiq", Name: "time_to_first_token_seconds", Help: "From arrival to the first generated token.", Buckets: lat})
	m.itl = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "cortiq", Name: "inter_token_latency_seconds", Help: "Between consecutive tokens of one sequence.", Buckets: lat})
	f(m.ttft)
	f(m.itl)
	m.kvUsed = g("kv_cache_tokens", "Tokens held in the KV caches of all slots.")
	m.kvCapacity = g("kv_cache_capacity_tokens", "Tokens the KV caches of all slots can hold (--ctx × --parallel).")
	m.prefixHits = c("prefix_cache_hits_total", "Requests that reused a cached prompt prefix.")
	m.prefixHitTokens = c("prefix_cache_hit_tokens_total", "Prompt tokens reused from cache.")
	m.steps = c("batch_steps_total", "Batched model steps.")
	m.stepRows = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "cortiq", Name: "batch_step_sequences", Help: "Sequences per batched step.", Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128}})
	f(m.stepRows)
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "cortiq", Name: "http_requests_total", Help: "HTTP requests by endpoint and status."}, []string{"endpoint", "code"})
	f(m.requests)
	m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "cortiq", Name: "requests_rejected_total", Help: "Requests refused, by reason."}, []string{"reason"})
	f(m.rejected)
	f(collectors.NewGoCollector())
	return m
}
