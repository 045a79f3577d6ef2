//go:build tools

// Package tools pins the binaries built by e2e/cluster.py.
package tools

import (
	_ "github.com/yannh/kubeconform/cmd/kubeconform"
)
