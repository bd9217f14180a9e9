//go:build tools

// Package tools pins the Spark operator's command, built unchanged from its module
// (testbed/cluster.sh): go build github.com/kubeflow/spark-operator/v2/cmd/operator
package tools

import _ "github.com/kubeflow/spark-operator/v2/cmd/operator"
