//go:build tools

// Package tools pins the policy agent's command package, built unchanged from its module
// (testbed/cluster.sh): go build sigs.k8s.io/kube-network-policies/cmd
package tools

import _ "sigs.k8s.io/kube-network-policies/cmd"
