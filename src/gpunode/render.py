"""Human-readable output of a plan."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpunode.derive.plan import HostPlan


def _print_live_applies(live: dict[str, Any], console: Console) -> None:
    """plan --live: the Proxmox version's hot-plug rule, and what a provision would apply when."""
    if not live.get("pve_version"):
        return
    console.print(f"  {escape(str(live['hotplug_rule']))}")
    if live.get("devices_note"):
        console.print(f"  a provision applies at once: {', '.join(live['applies_live']) or 'nothing'}; "
                      f"at the restart: {', '.join(live['applies_at_restart']) or 'nothing'}")
        console.print(f"  [dim]{escape(str(live['devices_note']))}[/dim]")


def print_plan(plans: list[HostPlan], console: Console) -> None:
    for plan in plans:
        console.rule(f"host {plan.name}")
        for note in plan.notes:
            console.print(f"[cyan]note:[/cyan] {note}")
        for warning in plan.warnings:
            console.print(f"[yellow]warning:[/yellow] {warning}")
        console.print(f"Proxmox API: {plan.api['url']} node {plan.api['node']}, auth {plan.api['auth']} "
                      f"as {plan.api['user']}, TLS {plan.api['tls']}")
        console.print(f"GPU node (inside the container): {plan.node['user']}@{plan.node['address']}:{plan.node['port']}")

        console.print("\n[bold]Host changes[/bold]")
        for change in plan.host_changes:
            console.print(f"  - {change}")
        console.print("\n[bold]Node changes[/bold] (inside the container)")
        for change in plan.node_changes:
            console.print(f"  - {escape(change)}")

        if plan.ownership is not None:
            style = {"free": "green", "gpunode": "green", "foreign": "red"}[plan.ownership["owner"]]
            console.print(f"[{style}]live: {escape(plan.ownership['detail'])}[/{style}]")
            _print_live_applies(plan.ownership, console)
        console.print(f"\n[bold]Container {plan.container['vmid']} (Proxmox config)[/bold]")
        for key, value in plan.container.items():
            console.print(f"  {key}: {value}")
        conditional = [rule for rule in plan.dev_rules if rule["when"] != "always"]
        for rule in conditional:
            console.print(f"  [dim]{rule['key']} applies {rule['when']}[/dim]")
        console.print("  [dim]# devN keys as a new container gets them; an existing one keeps the key each path "
                      "has[/dim]")

        if "mount" in plan.handoff:
            console.print(f"  mpN: {plan.handoff['mount']}  [dim]# the lowest free mpN; the driver version is the "
                          "loaded one[/dim]")
        console.print(f"\n[bold]GPU and driver hand-off[/bold]: {plan.handoff['kind']} ({plan.handoff['why']})")
        for layer in plan.handoff["layers"]:
            console.print(f"  - {escape(layer)}")

        console.print("\n[bold]Image[/bold]")
        console.print(f"  stack: {plan.image['stack']} (CUDA {plan.image['stack_cuda']}, needs driver >= "
                      f"{plan.image['stack_driver_min']}; profile {plan.image['profile']}): {escape(plan.image['stack_why'])}")
        console.print(f"  tag: {plan.image['tag']} (base {plan.image['base']}, built on {plan.image['build_on']})")
        console.print("  pins: " + ", ".join(f"{k} {v}" for k, v in plan.image["pins"].items()))
        image = plan.image
        console.print(f"  base: {escape(image['base'])} (Python {image['base_python']}; {escape(image['base_why'])})")
        console.print(f"  base digest: {escape(image['base_digest'])}")
        console.print(f"  toolchain: {escape(image['toolchain'])}")
        console.print(f"  target: {image['gpu_model']}, arch {image['target_arch']}")
        built = [m for m in image["flashinfer_aot"] if m["ahead_of_time"]]
        console.print(f"  FlashInfer ahead of time: {len(built)} of the profile's {len(image['flashinfer_aot'])} modules"
                      + (f" ({escape(image['flashinfer_aot_note'])})" if image["flashinfer_aot_note"] else ""))
        for module in image["flashinfer_aot"]:
            mark = "built" if module["ahead_of_time"] else "[yellow]JIT[/yellow]"
            console.print(f"    {mark} {module['group']}: {module['name']}  [dim]# {escape(module['why'])}[/dim]")
        for item in image["jit_only"]:
            console.print(f"    [yellow]JIT[/yellow] {escape(item['what'])}  [dim]# {escape(item['why'])}[/dim]")
        console.print(f"  JIT cache: volume {escape(image['jit_cache_volume'])}")
        if plan.image["lab_stand_in"]:
            console.print(f"  [yellow]lab: the server runs the stand-in {plan.image['server_image']} (the fake SGLang "
                          "server; no GPU here), shipped to the node by the image stage[/yellow]")

        model = plan.model
        console.print(f"\n[bold]Model[/bold] {model['repo']}" + (f" at {model['revision']}" if model["revision"] else "")
                      + f": {escape(model['from'])}")
        console.print(f"  weights: {escape(model['weights_dir'])} on the {'Proxmox host' if model['on'] == 'host' else 'node'}"
                      + (f", manifest {escape(model['manifest'])}" if model["manifest"] else ""))
        if model["mount"]:
            console.print(f"  mount: {escape(model['mount'])}")
        if model["token"]:
            console.print(f"  token: {escape(model['token'])}")
        console.print(f"  verify: {model['verify']} (README 'The model': what each level reads)")
        console.print(f"  installs: {escape(model['tools'])}")
        console.print(f"  {escape(model['recreate'])}")

        server = plan.server
        console.print(f"\n[bold]Server[/bold] profile {server['profile']}: {server['model']} from {server['model_path']} "
                      f"as {server['served_name']} on {server['bind']}:{server['port']}")
        console.print(f"  {server['command']}", soft_wrap=True)
        for name, value in server["env"].items():
            console.print(f"  {name}={value}  [dim]# {server['reasons'].get(name, '')}[/dim]")
        if server.get("restart"):
            console.print(f"  restarts: {escape(server['restart'])}")
        if plan.forecast is not None:
            console.print(f"  live: {escape(plan.forecast['line'])}")

        if plan.monitor is not None:
            mon = plan.monitor
            console.print(f"\n[bold]Monitor[/bold] {escape(mon['runs'])}")
            console.print(f"  scrapes every {mon['scrape_interval_s']} s, keeps {mon['retention']}: "
                          + escape(", ".join(mon["targets"])))
            console.print(f"  alerts: {escape('; '.join(mon['alerts']))}")
            console.print(f"  reach: {escape(mon['reach'])}")

        table = Table(title="stages and checks", show_lines=False)
        table.add_column("stage")
        table.add_column("does / checks")
        for stage in plan.stages:
            table.add_row(stage["name"], stage["summary"] + "".join(f"\n  - {check}" for check in stage["checks"]))
        console.print(table)


def print_router_plan(router: dict[str, Any], console: Console) -> None:
    console.rule("router")
    console.print(f"SGLang's router on {router['runs_on']}: {router['url']} (policy {router['policy']}, "
                  f"API key {router['api_key'] or 'none'})")
    console.print(f"image {router['image']} (base {router['image_base']}, built on {router['image_built_on']})")
    console.print(f"command: {escape(router['command'])}")
    console.print(f"metrics: {router['metrics']}")
    console.print("[bold]Workers[/bold]")
    for worker in router["workers"]:
        console.print(f"  - {worker['host']}: {worker['url']} (node {worker['node']})")
    rolling = router["rolling"]
    order = "; then ".join(", ".join(batch) for batch in rolling["order"])
    console.print(f"[bold]Rolling changes[/bold]: {order} (batch {rolling['batch']}); each taken out of the router and "
                  f"drained (at most {rolling['drain_timeout_s']} s), changed, served, smoke-tested and put back before "
                  f"the next; a batch stops the roll when more than {rolling['max_fail_percent']} % of it fails, and its "
                  f"failed hosts stay out. When: {escape(rolling['when'])}")
    console.print(f"[bold]Stage[/bold] {router['stage']['name']}: {router['stage']['summary']}")
    for check in router["stage"]["checks"]:
        console.print(f"  check: {check}")
