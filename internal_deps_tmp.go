package main
import (
 _ "github.com/dgraph-io/badger/v4"
 _ "golang.org/x/sys/unix"
 _ "github.com/urfave/cli/v2"
 _ "github.com/prometheus/client_golang/prometheus"
 _ "github.com/hanwen/go-fuse/v2/fs"
)
func main(){}
