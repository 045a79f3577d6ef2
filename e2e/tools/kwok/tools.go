//go:build tools

// Package tools pins the binaries built by e2e/cluster.py.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
