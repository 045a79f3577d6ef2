// Command custom-metrics-adapter serves custom.metrics.k8s.io and external.metrics.k8s.io for the
// e2e cluster of e2e/cluster.py: sigs.k8s.io/custom-metrics-apiserver's AdapterBase with the
// library's own test provider (test-adapter/provider), whose metric values are written over HTTP.
//
// It differs from the library's test-adapter/main.go in two things: the HTTP server that takes
// the values (POST /write-metrics/namespaces/{namespace}/{resourceType}/{name}/{metric}, the value
// as a JSON quantity in the body) listens on --write-metrics-address (e.g. 127.0.0.1:PORT) instead
// of :8080 on every interface; and the discovery REST mapper is refreshed every
// --discovery-interval, so that resources defined after the start (CRDs) can be described.
package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/emicklei/go-restful/v3"
	"k8s.io/component-base/logs"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"sigs.k8s.io/custom-metrics-apiserver/pkg/apiserver/metrics"
	basecmd "sigs.k8s.io/custom-metrics-apiserver/pkg/cmd"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/dynamicmapper"
	fakeprov "sigs.k8s.io/custom-metrics-apiserver/test-adapter/provider"
)

func main() {
	logs.InitLogs()
	defer logs.FlushLogs()

	adapter := &basecmd.AdapterBase{Name: "custom-metrics-adapter"}
	var writeAddress string
	adapter.Flags().StringVar(&writeAddress, "write-metrics-address", "",
		"host:port of the HTTP server that takes metric values (POST /write-metrics/...); required")
	logs.AddFlags(adapter.Flags())
	if err := adapter.Flags().Parse(os.Args[1:]); err != nil {
		klog.Fatalf("unable to parse flags: %v", err)
	}
	if writeAddress == "" {
		klog.Fatalf("--write-metrics-address is required (e.g. 127.0.0.1:8080)")
	}

	client, err := adapter.DynamicClient()
	if err != nil {
		klog.Fatalf("unable to construct dynamic client: %v", err)
	}
	mapper, err := adapter.RESTMapper()
	if err != nil {
		klog.Fatalf("unable to construct discovery REST mapper: %v", err)
	}
	ctx := context.Background()
	if regenerating, ok := mapper.(*dynamicmapper.RegeneratingDiscoveryRESTMapper); ok && adapter.DiscoveryInterval > 0 {
		regenerating.RunUntil(ctx.Done())
	}
	provider, webService := fakeprov.NewFakeProvider(client, mapper)
	adapter.WithCustomMetrics(provider)
	adapter.WithExternalMetrics(provider)
	if err := metrics.RegisterMetrics(legacyregistry.Register); err != nil {
		klog.Fatalf("unable to register metrics: %v", err)
	}

	// Bind before serving the API, so that a taken address fails the start at once.
	listener, err := net.Listen("tcp", writeAddress)
	if err != nil {
		klog.Fatalf("unable to listen on --write-metrics-address %s: %v", writeAddress, err)
	}
	container := restful.NewContainer()
	container.Add(webService)
	go func() {
		server := &http.Server{Handler: container, ReadHeaderTimeout: 3 * time.Second}
		err := server.Serve(listener)
		if !errors.Is(err, http.ErrServerClosed) {
			klog.Fatalf("metric write server on %s: %v", writeAddress, err)
		}
	}()
	klog.Infof("taking metric values on http://%s/write-metrics/", listener.Addr())

	if err := adapter.Run(ctx); err != nil {
		klog.Fatalf("unable to run custom metrics adapter: %v", err)
	}
}
