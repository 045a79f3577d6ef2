//go:build tools

// Package tools pins the binaries built by e2e/cluster.py.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
