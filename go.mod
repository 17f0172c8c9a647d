module github.com/coalescer/dispatch

go 1.26.0

require (
	github.com/google/btree v1.1.3
	go.uber.org/goleak v1.3.0
	golang.org/x/time v0.16.0
)

require (
	github.com/stretchr/testify v1.12.1
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
