// Package check holds the static checks of deploy/: the Kubernetes
// manifests decoded strictly into the typed API structs and checked for
// consistency, the compose file and Dockerfile checked against the dragon
// CLI as its source defines it, and the shell scripts' syntax and --help.
//
// It is a module of its own so that the main module gains no dependency on
// k8s.io. Run it with `make deploy-check`, or
// `cd deploy/check && go test ./...`.
package check
