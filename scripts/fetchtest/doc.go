// Package fetchtest holds no code of the product: its tests run the fetch
// scripts of the folder above (fetching, joining and checking models) on
// inputs they make themselves.
package fetchtest
