// Package kube adapts the dispatch library to the Kubernetes API.
package kube
