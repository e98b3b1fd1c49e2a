package main

// The daemon's HTTP side: /metrics, /healthz, /readyz.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/rs/zerolog"
)

// metricsURL is the /metrics URL of the listener bound at addr; a wildcard
// address takes advertise's host (tcp://host:port) when there is one.
func metricsURL(addr, advertise string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if h, _, err := net.SplitHostPort(strings.TrimPrefix(advertise, "tcp://")); err == nil {
			host = h
		}
	}
	return "http://" + net.JoinHostPort(host, port) + "/metrics"
}

// probes routes /healthz, /readyz and /metrics.
func probes(ready *atomic.Bool, metrics *atomic.Pointer[http.Handler]) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		h := metrics.Load()
		if h == nil {
			http.Error(w, "node not open", http.StatusServiceUnavailable)
			return
		}
		(*h).ServeHTTP(w, r)
	})
	return mux
}

// promLogger sends promhttp's errors to the structured log.
type promLogger struct{ log zerolog.Logger }

// Println implements promhttp.Logger.
func (l promLogger) Println(v ...any) {
	l.log.Error().Msg(strings.TrimSpace(fmt.Sprintln(v...)))
}
