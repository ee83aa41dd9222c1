// Package v1 declares the one Kubernetes API type the Memory Manager checkpoint uses, so that
// go-spew prints it as the kubelet's does ("v1.ResourceName").
package v1

// ResourceName is a resource's name, such as "memory" or "hugepages-2Mi".
type ResourceName string
