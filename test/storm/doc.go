// Package storm reproduces kubernetes#135900 in the real kube-scheduler and
// measures dispatch against it.
package storm
