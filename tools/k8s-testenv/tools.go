//go:build tools

// Package testenv pins the commands that build.sh compiles from this module:
// kube-apiserver and kubectl from k8s.io/kubernetes, etcd through ./cmd/etcd, and for the
// real single-node cluster of tools/k8s-node also kubelet, kube-controller-manager and
// kube-scheduler.
// The imports are never compiled (build tag "tools"); they keep `go mod tidy`
// from dropping the requirements and their go.sum entries.
package testenv

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
