// SPDX-License-Identifier: Apache-2.0

// Package clidoc turns a program's cobra command tree into the man pages
// the Debian package ships (`make deb`), so the pages cannot drift from the
// flags and help texts the binaries really have.
package clidoc

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// Command is a hidden `gendoc DIR` subcommand of root that writes one man
// page per command of root (section 8: both programs administer the box)
// into DIR, each titled after its command (L4LBCTL-CONFIG-DIFF). The
// pages are dated SOURCE_DATE_EPOCH when set, so a package build is
// reproducible.
func Command(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:    "gendoc DIR",
		Short:  "write the man pages of every command into DIR (packaging)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			root.DisableAutoGenTag = true
			hdr := &doc.GenManHeader{Section: "8", Source: "l4lb", Manual: "l4lb manual"}
			if err := doc.GenManTree(root, hdr, args[0]); err != nil {
				return fmt.Errorf("write man pages: %w", err)
			}
			return nil
		},
	}
}
