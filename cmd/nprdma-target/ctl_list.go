package main

import (
	"context"

	"github.com/nprdma/nprdma/target/manage"
	"github.com/urfave/cli/v2"
)

func ctlList() *cli.Command {
	return &cli.Command{
		Name:    "list",
		Aliases: []string{"list-subsys"},
		Usage:   "list the subsystems with their hosts, connected controllers and namespaces, and the target's DRAM and capacity",
		Description: "Prints the inventory (method nvmf_get_subsystems): memory_bytes (--memory), memory_budgeted_bytes and\n" +
			"memory_free_bytes (the DRAM budgets of the namespaces, and what is left for new ones), volume_dir with its\n" +
			"capacity_bytes and available_bytes (what new namespaces may still take: free space less what the sparse\n" +
			"files the target created may still claim), provisioned_bytes; per namespace its size, max_size_bytes (how\n" +
			"large it may grow while served), budget, resident and dirty bytes, and used_bytes (what its file takes on disk).",
		Action: func(cc *cli.Context) error {
			if err := ctlArgs(cc); err != nil {
				return err
			}
			return ctlRun(cc, func(ctx context.Context, c *manage.Client) (any, error) { return c.Inventory(ctx) })
		},
	}
}
