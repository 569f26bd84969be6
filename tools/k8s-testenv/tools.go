//go:build tools

// Package testenv pins the commands that build.sh compiles from this module:
// kube-apiserver and kubectl from k8s.io/kubernetes, etcd through ./cmd/etcd.
// The imports are never compiled (build tag "tools"); they keep `go mod tidy`
// from dropping the requirements and their go.sum entries.
package testenv

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
