// CoreDNS for the testbed's node, with only the plugins a cluster's DNS needs (CoreDNS's documented
// way to choose plugins at build time): the full build compiles some 60 plugins, several minutes
// on 2 cores, for nothing the node uses. Nothing outside the cluster is resolved (no forward:
// the node's network reaches nothing beyond itself).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// Directives in CoreDNS's plugin.cfg order (a query passes errors, log, cache, then kubernetes).
var directives = []string{"bind", "ready", "health", "errors", "log", "cache", "kubernetes"}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
