//go:build tools

// Package tools pins etcd's server main package so `go mod tidy` keeps it.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
