//go:build tools

// Package tools pins Prometheus' two commands so `go mod tidy` keeps them.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
