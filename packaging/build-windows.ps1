# Builds the Windows bundle with PyInstaller (dist\seqmoe-chat\), runs its self-test, and
# packs it into an installer with Inno Setup 6 (dist\SeqMoE-Chat-VERSION-windows-x64-setup.exe).
# Written for Windows 10/11 with Python 3.11+ from python.org and Inno Setup 6 (iscc.exe on
# PATH or in its default folder); it cannot be run on the Linux machines this project is
# developed on, so build on Windows and read each step's output.
#
#   powershell -ExecutionPolicy Bypass -File packaging\build-windows.ps1 [-TorchIndexUrl URL] [-Venv DIR]
#
# -TorchIndexUrl: install PyTorch from there first (https://download.pytorch.org/whl/cpu, or
# .../whl/cu128 for CUDA 12.8); otherwise the bundle ships whatever PyTorch the venv has.
param(
    [string]$TorchIndexUrl = "",
    [string]$Venv = ".venv"
)
$ErrorActionPreference = "Stop"
Set-Location (Join-Path $PSScriptRoot "..")

function Invoke-Checked {
    # A native program's failure does not stop a PowerShell script by itself.
    param([string]$Program, [string[]]$Arguments)
    & $Program @Arguments
    if ($LASTEXITCODE -ne 0) { throw "$Program failed with exit status $LASTEXITCODE" }
}

if (-not (Test-Path "$Venv\Scripts\python.exe")) { Invoke-Checked "py" @("-3", "-m", "venv", $Venv) }
$python = (Resolve-Path "$Venv\Scripts\python.exe").Path
if ($TorchIndexUrl) { Invoke-Checked $python @("-m", "pip", "install", "--quiet", "torch", "--index-url", $TorchIndexUrl) }
Invoke-Checked $python @("-m", "pip", "install", "--quiet", "-e", ".[packaging]")
$metadata = & $python -c "from seqmoe_chat.app_metadata import APP_ID, APP_TITLE, app_version; print(APP_ID); print(APP_TITLE); print(app_version())"
if ($LASTEXITCODE -ne 0) { throw "cannot read the app metadata" }
$appId, $appTitle, $version = $metadata

$watch = [Diagnostics.Stopwatch]::StartNew()
Invoke-Checked $python @("-m", "PyInstaller", "--noconfirm", "--clean", "--log-level", "WARN",
    "--distpath", "dist", "--workpath", "build\pyinstaller", "packaging\seqmoe-chat.spec")
$buildSeconds = [int]$watch.Elapsed.TotalSeconds

# seqmoe-chat.exe is a GUI program: PowerShell would not wait for it, and it prints only to a
# console it inherits, so it runs with its output sent to a file. Checked as build-linux does:
# the self-test, then `-m seqmoe generate` (how the app starts its child processes, see launcher.py).
function Invoke-Bundle {
    param([string[]]$Arguments)
    $output = Join-Path $env:TEMP "seqmoe-chat-check.txt"
    $process = Start-Process -FilePath "dist\seqmoe-chat\seqmoe-chat.exe" -ArgumentList $Arguments `
        -NoNewWindow -Wait -PassThru -RedirectStandardOutput $output
    $text = Get-Content -Raw $output
    if ($process.ExitCode -ne 0) { throw "seqmoe-chat $Arguments failed (exit status $($process.ExitCode)): $text" }
    return $text
}
Invoke-Bundle @("--self-test")
$reply = Invoke-Bundle @("-m", "seqmoe", "generate", "--prompt", "Hi!", "--max-new-tokens", "4", "--json")
if ($reply -notmatch '"tokens_per_s"') { throw "seqmoe-chat -m seqmoe generate gave no reply: $reply" }
Write-Output "seqmoe-chat -m seqmoe generate: OK"

$iscc = (Get-Command iscc.exe -ErrorAction SilentlyContinue).Source
if (-not $iscc) { $iscc = "${env:ProgramFiles(x86)}\Inno Setup 6\ISCC.exe" }
if (-not (Test-Path $iscc)) { throw "Inno Setup 6 is not installed (https://jrsoftware.org/isinfo.php)" }
Invoke-Checked $iscc @("/Q", "/DAppId=$appId", "/DAppTitle=$appTitle", "/DAppVersion=$version", "packaging\seqmoe-chat.iss")

$size = (Get-ChildItem -Recurse "dist\seqmoe-chat" | Measure-Object -Sum Length).Sum / 1MB
Write-Output ("bundle: dist\seqmoe-chat {0:N0} MB; installer: dist\SeqMoE-Chat-$version-windows-x64-setup.exe" -f $size)
Write-Output "time: PyInstaller $buildSeconds s"
